"""Per-test CPU cost, for finding what makes the suite slow (`CONVEYOR_TEST_CPU_REPORT=DIR`).

Wall time says little on a loaded 2-core machine: a test waits for whatever else runs. This records, per
test, the CPU seconds of the pytest worker and of its preloader (tests/support/preloaded.py), each with
the children they have reaped: the servers, agents, CLIs and browsers a test started and stopped. What a
test leaves running, PostgreSQL's backends and detached processes are not counted. Each worker appends
`{"nodeid", "cpu_s", "wall_s"}` lines to DIR/cpu-<worker>.jsonl; `python -m tests.support.cpu_report DIR`
prints the costliest tests and files.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

_TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    """utime + stime + cutime + cstime of `pid` in seconds (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(v) for v in fields[11:15]) / _TICKS


def _tree_cpu_s() -> float:
    from tests.support.preloaded import Preloader

    total = _cpu_s(os.getpid())
    preloader = Preloader._current
    if preloader is not None:
        total += _cpu_s(preloader.process.pid)
    return total


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    directory = os.environ.get("CONVEYOR_TEST_CPU_REPORT")
    if not directory:
        yield
        return
    cpu, wall = _tree_cpu_s(), time.monotonic()
    yield
    line = {"nodeid": item.nodeid, "cpu_s": _tree_cpu_s() - cpu, "wall_s": time.monotonic() - wall}
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(Path(directory) / f"cpu-{worker}.jsonl", "a") as out:
        out.write(json.dumps(line) + "\n")


def main(directory: str, top: int = 40) -> None:
    """Print the costliest tests and test files of a report directory."""
    rows = [json.loads(line) for path in Path(directory).glob("cpu-*.jsonl") for line in path.open()]
    per_file: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    for row in rows:
        entry = per_file[row["nodeid"].split("::")[0]]
        entry[0] += row["cpu_s"]
        entry[1] += row["wall_s"]
        entry[2] += 1
    print(f"total CPU {sum(r['cpu_s'] for r in rows):.0f} s over {len(rows)} tests")
    print("-- files by CPU s (tests, wall s)")
    for name, (cpu, wall, count) in sorted(per_file.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"{cpu:8.1f} {int(count):5d} {wall:8.1f}  {name}")
    print("-- tests by CPU s (wall s)")
    for row in sorted(rows, key=lambda r: -r["cpu_s"])[:top]:
        print(f"{row['cpu_s']:8.1f} {row['wall_s']:8.1f}  {row['nodeid']}")


if __name__ == "__main__":
    main(*sys.argv[1:2])
