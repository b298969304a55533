"""`run logs --follow` says why a job waits, and why a run ended; `run list` says why a run failed.

A real `conveyor server` per dialect (short sweep interval), a real agent process.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.model.durations import duration_text
from tests.support.agents import agent_process
from tests.support.dispatch_stage import FAST, GPU_WORKFLOW, Stage
from tests.support.follow import start_follow
from tests.support.processes import ServerProcess, run_cli
from tests.support.repos import make_repo
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

# Both jobs wait for a file the test never writes: with one agent of capacity 1, one runs and the
# other waits for it.
BUSY_WORKFLOW = """
import pathlib
import time

from conveyor import push, workflow

busy = workflow("busy", on=[push(branches=["main"])])


def hold(ctx):
    while not pathlib.Path("RELEASE").exists():
        time.sleep(0.2)


busy.job("first", runs_on=["linux"], run=hold)
busy.job("second", runs_on=["linux"], run=hold)
"""
NO_AGENT = "unschedulable: no connected agent or scaler matches [gpu, linux]"


@pytest.fixture(scope="module")
def server(module_database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    home = tmp_path_factory.mktemp("follow") / "home"
    # An unschedulable job fails only when a test lowers the grace (cluster settings apply at once).
    process = ServerProcess(
        home, database_url=module_database_url, env={**FAST, "CONVEYOR_UNROUTABLE_GRACE_MS": "3600000"}
    )
    try:
        process.wait_ready()
        yield process
    finally:
        process.stop()


def staged(server: ServerProcess, tmp_path: Path, name: str, workflow: str) -> Stage:
    s = Stage(server, make_repo(tmp_path / name, {name: workflow}))
    s.add_source(name)
    return s


class Follower:
    """`conveyor admin run logs RUN --follow` as a process whose lines are read as they come."""

    def __init__(self, s: Stage, run_id: str) -> None:
        self.proc = start_follow({"CONVEYOR_URL": s.server.url, "CONVEYOR_TOKEN": s.token}, run_id)
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_line(self, pattern: str, timeout: float = 60) -> str:
        found: str = wait_until(
            lambda: next((line for line in self.lines if re.search(pattern, line)), None),
            timeout=timeout,
            what=f"a line matching {pattern!r} in {self.lines}",
        )
        return found

    def finish(self, timeout: float = 60) -> int:
        code = self.proc.wait(timeout=timeout)
        self.reader.join(timeout=10)
        return code

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def run_list(s: Stage, *args: str) -> str:
    done = run_cli(
        ["admin", "run", "list", *args], env={"CONVEYOR_URL": s.server.url, "CONVEYOR_TOKEN": s.token}
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_follow_prints_why_a_job_waits_and_the_reason_it_failed(
    server: ServerProcess, tmp_path: Path
) -> None:
    s = staged(server, tmp_path, "ml", GPU_WORKFLOW)
    run_id = s.push()
    follower = Follower(s, run_id)
    try:
        follower.wait_line(re.escape(f"[train] {NO_AGENT}"))
        lowered = s.api("PATCH", "/cluster-settings", json={"unroutable_grace_ms": 0})
        assert lowered.status_code == 200, lowered.text
        assert follower.finish(timeout=120) == 5, follower.lines
    finally:
        follower.stop()
        s.api("PATCH", "/cluster-settings", json={"unroutable_grace_ms": 3_600_000})
    assert follower.lines.count(f"[train] {NO_AGENT}") == 1  # printed once, when it changed
    reason = "train: unroutable: no connected agent or scaler matches [gpu, linux]"
    assert follower.lines[-1] == f"run #1 ml did not succeed: failed ({reason})"

    listed = run_list(s, "--workflow", "ml")
    assert reason in listed
    header, row = listed.splitlines()[:2]
    assert header.split()[4:] == ["source", "ref", "sha", "created_at", "duration", "reason"]
    shown = s.run(run_id)
    # The source's routing key; no duration: the run never started.
    assert f" {shown['routing_key']} " in row and shown["started_at"] is None
    assert shown["status"] == "failed" and shown["ended_because"] == reason
    listed_json = s.api("GET", "/runs", params={"workflow": "ml"}).json()["items"]
    assert [item["ended_because"] for item in listed_json] == [reason]


def test_follow_prints_a_busy_agent_and_a_cancelled_run_says_who_cancelled_it(
    server: ServerProcess, tmp_path: Path
) -> None:
    s = staged(server, tmp_path, "busy", BUSY_WORKFLOW)
    with agent_process(s, tmp_path / "agent-home"):
        run_id = s.push()
        follower = Follower(s, run_id)
        try:
            waiting = follower.wait_line(r"^\[(first|second)\] waiting: 1 matching agent busy$", timeout=120)
            cancelled = run_cli(
                ["admin", "run", "cancel", run_id, "--reason", "enough"],
                env={"CONVEYOR_URL": s.server.url, "CONVEYOR_TOKEN": s.token},
            )
            assert cancelled.returncode == 0, cancelled.stderr
            assert follower.finish(timeout=120) == 5, follower.lines
        finally:
            follower.stop()
    queued_job = waiting[1 : waiting.index("]")]
    last = follower.lines[-1]
    assert last.startswith(f"run #1 busy did not succeed: cancelled ({queued_job}: cancelled_by: "), last
    assert last.endswith(": enough)"), last
    listed = run_list(s, "--workflow", "busy")
    assert last.removeprefix("run #1 busy did not succeed: cancelled (").removesuffix(")") in listed
    # The run started on the agent: its duration is in the list, as the dashboard's runs list shows it.
    shown = s.run(run_id)
    assert f" {duration_text(shown['started_at'], shown['finished_at'])} " in listed.splitlines()[1]
    assert re.search(r" \d+(\.\d)? s ", listed.splitlines()[1]), listed
