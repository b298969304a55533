"""The runner the agent keeps ready before a job arrives (issue 19): handed out, replaced, never a trap.

Real: the agent process, its runners (`python -m conveyor.agent.runner --wait`), their step processes and a
git checkout over file://. Fake: the orchestrator side of `/ws`.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from tests.integration.agent.conftest import AgentProcess, until
from tests.support.fake_orchestrator import FakeOrchestrator, job_dispatch

pytestmark = pytest.mark.slow

Start = Callable[..., AgentProcess]


def ready_runners(agent: AgentProcess) -> list[int]:
    """Pids of the agent's children that are runners waiting for a job."""
    found = []
    for child in psutil.Process(agent.proc.pid).children():
        try:
            argv = child.cmdline()
        except psutil.Error:
            continue
        if "conveyor.agent.runner" in argv and "--wait" in argv and child.status() != psutil.STATUS_ZOMBIE:
            found.append(child.pid)
    return found


async def test_a_killed_ready_runner_is_replaced_and_the_next_job_runs(
    fake: FakeOrchestrator, ci_repo: Path, agents: Start
) -> None:
    agent = agents(fake.url)
    connection = await until(fake.registered, what="the agent to register")
    [first] = await until(lambda: ready_runners(agent) or None, what="a runner to be kept ready")

    os.kill(first, signal.SIGKILL)
    replacement = await until(
        lambda: [pid for pid in ready_runners(agent) if pid != first] or None,
        what=f"a replacement ready runner:\n{agent.output()}",
    )

    dispatch = job_dispatch(ci_repo)
    await fake.dispatch(dispatch)
    finished = await until(
        lambda: [m for m in connection.of_type("job.finished") if m["job_id"] == dispatch["job_id"]],
        what=f"job.finished:\n{agent.output()}",
    )
    assert finished[0]["status"] == "success", finished
    # The job ran in the replacement (it is no longer waiting), and a new one is kept ready after it.
    assert replacement[0] not in ready_runners(agent)
    await until(
        lambda: [pid for pid in ready_runners(agent) if pid not in (first, replacement[0])] or None,
        what="the next ready runner",
    )


async def test_an_ephemeral_agent_keeps_no_runner_ready_after_its_job(
    fake: FakeOrchestrator, ci_repo: Path, agents: Start
) -> None:
    agent = agents(fake.url, "--ephemeral")
    connection = await until(fake.registered, what="the agent to register")
    await until(lambda: ready_runners(agent) or None, what="a runner ready for the one job")
    dispatch = job_dispatch(ci_repo)
    await fake.dispatch(dispatch)
    await until(lambda: connection.of_type("job.finished") or None, what="job.finished")
    assert ready_runners(agent) == []
