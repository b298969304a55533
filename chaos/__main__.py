"""`python -m chaos --duration SECONDS --seed N`: one chaos run; exit 1 on any violation (docs/chaos.md)."""

from __future__ import annotations

import argparse
import re
import signal
import sys
from pathlib import Path

from chaos.load import Mix
from chaos.run import Options, environment_check, run


def duration(text: str) -> float:
    """`90`, `90s`, `30m` or `1h` as seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration (90, 90s, 30m, 1h)")
    return float(match.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[match.group(2)]


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    """Parse the flags, run, print the summary; 0 when no invariant was violated."""
    parser = argparse.ArgumentParser(prog="python -m chaos", description=__doc__)
    parser.add_argument(
        "--duration", type=duration, default=60.0, help="how long load and faults last (default 60)"
    )
    parser.add_argument("--seed", type=int, default=1, help="seeds the fault schedule and the load")
    parser.add_argument("--rate", type=float, default=20.0, help="webhooks per second (default 20)")
    parser.add_argument(
        "--mean-gap", type=float, default=6.0, help="mean seconds between fault starts (default 6)"
    )
    parser.add_argument(
        "--main-share", type=float, default=Mix.main, help="share of webhooks that start a ci run"
    )
    for kind in ("resend", "generic", "ignored", "skip"):
        parser.add_argument(
            f"--{kind}-share", type=float, default=getattr(Mix, kind), help=f"share of {kind} webhooks"
        )
    parser.add_argument(
        "--quiesce", type=duration, default=300.0, help="how long to wait for the cluster to settle"
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the work directory (always kept on a violation)"
    )
    parser.add_argument("--no-tmpfs", action="store_true", help="no tmpfs homes (and so no disk-full faults)")
    parser.add_argument(
        "--postgres",
        choices=["private", "shared"],
        default=None,
        help="a private PostgreSQL server for the run (default when installed), or the shared one",
    )
    parser.add_argument("--workdir", type=Path, default=None, help="where the run's directory is made")
    args = parser.parse_args(argv)
    refusal = environment_check()
    if refusal:
        print(f"chaos: {refusal}", file=sys.stderr)
        return 2
    options = Options(
        duration_s=args.duration,
        seed=args.seed,
        rate=args.rate,
        mean_gap_s=args.mean_gap,
        quiesce_s=args.quiesce,
        keep=args.keep,
        tmpfs=not args.no_tmpfs,
        workdir=args.workdir,
        mix=Mix(
            main=args.main_share,
            resend=args.resend_share,
            generic=args.generic_share,
            ignored=args.ignored_share,
            skip=args.skip_share,
        ),
    )
    if args.postgres:
        options.postgres = args.postgres
    # A SIGTERM (a CI timeout, `kill`) unwinds like Ctrl-C, so the run's processes, mounts and database
    # are cleaned up by its `finally`.
    signal.signal(signal.SIGTERM, _interrupt)
    outcome = run(options)
    return 1 if outcome.violations else 0


if __name__ == "__main__":
    sys.exit(main())
