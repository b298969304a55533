"""Run every benchmark and print one summary table (`make bench` runs this with --quick).

Each script runs as its own process (`python -m bench.<name>`), prints its progress and table, and
hands its figures over as JSON; this prints them all together at the end, the two ratios first.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

from bench.harness import REPO_ROOT, Figure, format_table, machine, workdir

SCRIPTS = (
    "ingest",
    "queue",
    "latency",
    "memory",
    "matching",
    "events",
    "cli",
    "dashboard",
    "container_start",
    "container_job",
    "artifacts",
    "caches",
    "buildbot_peer",
)
HEADLINES = ("conveyor_p50 / buildbot_p50", "Conveyor / plain SQL")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="every script in its quick mode")
    parser.add_argument(
        "--skip", default="", help="comma-separated scripts to leave out (e.g. buildbot_peer)"
    )
    parser.add_argument("--only", default="", help="comma-separated scripts to run (default all)")
    args = parser.parse_args()
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    chosen = [s for s in SCRIPTS if s not in skip and (not only or s in only)]
    chosen = [s for s in chosen if (REPO_ROOT / "bench" / f"{s}.py").exists()]
    figures: list[Figure] = []
    failed: list[str] = []
    started = time.monotonic()
    with workdir("conveyor-bench-all-") as base:
        for script in chosen:
            out = base / f"{script}.json"
            command = [sys.executable, "-m", f"bench.{script}", "--json", str(out)]
            if args.quick:
                command.append("--quick")
            print(f"\n### {script}: {' '.join(command[1:])}", flush=True)
            begun = time.monotonic()
            code = subprocess.call(command, cwd=REPO_ROOT)
            print(f"### {script}: exit {code} after {time.monotonic() - begun:.0f} s", flush=True)
            if out.exists():
                figures += [Figure(**f) for f in json.loads(out.read_text())["figures"]]
            if code != 0:
                failed.append(script)
                figures.append(Figure(f"{script}: script failed", None, "", note=f"exit {code}"))
    headline = [f for f in figures if any(h in f.name for h in HEADLINES)]
    rest = [f for f in figures if f not in headline]
    about = machine()
    print()
    print(
        format_table(
            headline + rest,
            f"== Conveyor benchmarks ({'quick' if args.quick else 'full'}, {time.monotonic() - started:.0f} s) "
            f"on {about['nproc']} CPUs, {about['memory']}, {about['cpu']}, Python {about['python']}",
        )
    )
    if failed:
        print(f"\nfailed: {', '.join(failed)}")
        raise SystemExit(1)


if __name__ == "__main__":
    main()
