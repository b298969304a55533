"""CLI start-up: `conveyor --help` and `conveyor admin run list` as whole processes, p50, against
`python -c "import typer"` and `python -c "import typer, httpx"` measured in the same run, interleaved.

Every `conveyor` call pays the CLI's import time, so the CLI imports the server stack, pydantic models
and httpx only in the commands that need them. Targets: `--help` within 1.5x of `import typer`;
`admin run list` (against a local SQLite server with a few runs' worth of nothing: an empty list is the
start-up cost, not the query) within 1.5x of `import typer, httpx`. The samples are interleaved so a
loaded machine slows each command alike.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from bench.harness import Report, arguments, finish, fresh_database, percentile, running_server, workdir

CONVEYOR = [sys.executable, "-m", "conveyor"]
RATIO_TARGET = 1.5


def _time(command: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    done = subprocess.run(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {done.returncode}: {done.stderr[-2000:]}")
    return elapsed * 1000


def main() -> None:
    parser = arguments(__doc__ or "", dialects=False)
    parser.add_argument("--samples", type=int, help="runs of each command (default 30, --quick 8)")
    args = parser.parse_args()
    samples = args.samples or (8 if args.quick else 30)
    report = Report("cli")
    print(f"== cli: {samples} interleaved samples of each command", flush=True)
    with workdir("conveyor-bench-cli-") as base:
        with fresh_database("sqlite", base) as url, running_server(base / "home", url) as server:
            env = {k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_")}
            env.update(CONVEYOR_URL=server.url, CONVEYOR_TOKEN=server.token)
            commands = {
                "import typer": [sys.executable, "-c", "import typer"],
                "import typer, httpx": [sys.executable, "-c", "import typer, httpx"],
                "conveyor --help": [*CONVEYOR, "--help"],
                "conveyor admin run list": [*CONVEYOR, "admin", "run", "list"],
            }
            for command in commands.values():  # warm the page cache and .pyc files
                _time(command, env)
            times: dict[str, list[float]] = {name: [] for name in commands}
            for _ in range(samples):
                for name, command in commands.items():
                    times[name].append(_time(command, env))
    p50 = {name: percentile(values, 50) for name, values in times.items()}
    for name in ("import typer", "import typer, httpx"):
        report.add(f"cli baseline: python -c '{name}' p50", p50[name], "ms", note="same run")
    for name, baseline in (
        ("conveyor --help", "import typer"),
        ("conveyor admin run list", "import typer, httpx"),
    ):
        report.add(f"cli: {name} p50", p50[name], "ms")
        ratio = p50[name] / p50[baseline]
        report.add(
            f"cli: {name} / {baseline}",
            ratio,
            "x",
            target=f"<= {RATIO_TARGET}",
            met=ratio <= RATIO_TARGET,
        )
    finish(report, args)


if __name__ == "__main__":
    main()
