"""Two checkouts of Conveyor, one benchmark run: each chosen script runs on both, interleaved round by round.

`--before` is another checkout with its own `.venv` (e.g. `git worktree add ../before <commit>` and
`make .venv/.installed-test` there); `--after` defaults to this one. Each round runs every script on both
checkouts back to back, the order swapped every round so neither always runs on a warmer machine; the
figures of each side are the medians over the rounds, and the table gives after / before per figure. A
refactoring that claims no cost shows ratios within the spread of the rounds (printed beside them).

    .venv/bin/python -m bench.before_after --before ../before --rounds 2 --scripts latency,ingest,queue
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from bench.harness import REPO_ROOT, machine, workdir

# Each script's arguments for a comparison: long enough to be stable, short enough to repeat.
DEFAULT_ARGS = {
    "latency": ["--pushes", "20", "--no-cold"],
    "ingest": ["--seconds", "10"],
    "queue": ["--repeat", "1", "--jobs", "2000", "--history", "100000"],
}


def run_script(checkout: Path, script: str, extra: list[str], out: Path) -> dict[str, float]:
    """One run of `bench.<script>` in `checkout` with that checkout's interpreter: its numeric figures."""
    python = checkout / ".venv" / "bin" / "python"
    command = [str(python), "-m", f"bench.{script}", "--json", str(out), *extra]
    print(f"### {checkout.name}: {' '.join(command[1:])}", flush=True)
    code = subprocess.call(command, cwd=checkout)
    if code != 0 or not out.exists():
        print(f"### {script} failed in {checkout} (exit {code})", flush=True)
        return {}
    figures = json.loads(out.read_text())["figures"]
    return {f["name"]: float(f["value"]) for f in figures if f["value"] is not None}


def compare(
    before: list[dict[str, float]], after: list[dict[str, float]]
) -> list[tuple[str, str, str, str, str]]:
    """Rows of (figure, before median, after median, after/before, spread): the spread is the largest
    relative difference between two rounds of the same side, the noise a ratio is read against."""

    def spread(values: list[float]) -> float:
        low, high = min(values), max(values)
        return (high - low) / low if low else 0.0

    rows = []
    names = [name for name in before[0] if all(name in side for side in [*before, *after])] if before else []
    for name in names:
        b = [side[name] for side in before]
        a = [side[name] for side in after]
        mb, ma = statistics.median(b), statistics.median(a)
        ratio = f"{ma / mb:.2f}" if mb else "n/a"
        rows.append((name, f"{mb:,.2f}", f"{ma:,.2f}", ratio, f"±{max(spread(b), spread(a)) * 100:.0f} %"))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--before", type=Path, required=True, help="the baseline checkout (with its .venv)")
    parser.add_argument(
        "--after", type=Path, default=REPO_ROOT, help="the checkout measured (default: this one)"
    )
    parser.add_argument("--rounds", type=int, default=2, help="rounds; each runs every script on both sides")
    parser.add_argument("--scripts", default="latency,ingest,queue", help="comma-separated bench scripts")
    args = parser.parse_args()
    scripts = [s.strip() for s in args.scripts.split(",") if s.strip()]
    sides = {"before": args.before.resolve(), "after": args.after.resolve()}
    for side, checkout in sides.items():
        if not (checkout / ".venv" / "bin" / "python").exists():
            sys.exit(f"{side}: {checkout} has no .venv; run `make .venv/.installed-test` there first")
    print(f"== before_after: {machine()}", flush=True)
    results: dict[str, dict[str, list[dict[str, float]]]] = {s: {"before": [], "after": []} for s in scripts}
    with workdir("conveyor-bench-ab-") as base:
        for round_no in range(args.rounds):
            order = ["before", "after"] if round_no % 2 == 0 else ["after", "before"]
            for script in scripts:
                for side in order:
                    out = base / f"{script}-{side}-{round_no}.json"
                    figures = run_script(sides[side], script, DEFAULT_ARGS.get(script, []), out)
                    if figures:
                        results[script][side].append(figures)
    print()
    print(f"{'figure':<60} {'before':>12} {'after':>12} {'after/before':>13} {'spread':>8}")
    for script in scripts:
        for name, b, a, ratio, noise in compare(results[script]["before"], results[script]["after"]):
            print(f"{script + ': ' + name:<60.60} {b:>12} {a:>12} {ratio:>13} {noise:>8}")


if __name__ == "__main__":
    main()
