"""Processes started ahead of need (issue 19): a ready runner and the runner's spare step processes.

Real runners and step processes; the faults are real processes that die.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

from conveyor.agent.process import JobProcess, ReadyRunner, spawn_runner
from tests.integration.agent.conftest import job_spec, run_job, runner_env, write_workflow
from tests.support.agent_repos import build_wheel
from tests.support.scaler_backends import process_alive
from tests.support.waiting import async_wait_until

WORKFLOW = """
import os, sys
from conveyor import workflow, push
w = workflow("w", on=push())
j = w.job("j", runs_on="linux", env={"JOB_VAR": "set"})
@j.step
def first(ctx):
    return {"pid": os.getpid(), "var": os.environ.get("JOB_VAR", "")}
@j.step
def second(ctx):
    # Held until the test has looked at the runner's children (a file it writes), so the runner is alive
    # while it looks; the deadline only keeps a broken test from hanging.
    release = os.environ.get("RELEASE_FILE")
    if release:
        import time
        deadline = time.monotonic() + 60
        while not os.path.exists(release) and time.monotonic() < deadline:
            time.sleep(0.01)
    return {"pid": os.getpid(), "dont_write_bytecode": sys.flags.dont_write_bytecode}
"""


async def take_when_started(ready: ReadyRunner) -> Any:
    """The runner `ready` started, once it has said `ready`."""

    async def started() -> bool:
        return ready.pid is not None

    await async_wait_until(started, what="the ready runner to be started")
    taken = await ready.take(wait_s=30)
    assert taken is not None, "a runner is ready"
    return taken


async def test_a_ready_runner_runs_the_job_each_step_in_a_process_of_its_own(workspace: Path) -> None:
    release = workspace / "release"
    # The job's env, not the runner's: a step sees only allowlisted variables of its runner.
    lock = write_workflow(
        workspace / "src",
        WORKFLOW.replace(
            'env={"JOB_VAR": "set"}', f'env={{"JOB_VAR": "set", "RELEASE_FILE": {str(release)!r}}}'
        ),
    )
    ready = ReadyRunner(env=runner_env())
    ready.start()
    try:
        taken = await take_when_started(ready)
        process = JobProcess(env=runner_env())
        seen_children: set[int] = set()

        async def watch(message: dict[str, Any], _: JobProcess) -> None:
            # The second step waits for `release`, so the runner and its spares are alive here.
            if message["type"] == "step.started" and message["name"] == "second":
                seen_children.update(child.pid for child in psutil.Process(taken.pid).children())
                release.write_text("go")

        run = await run_job(job_spec(lock), workspace, process, on_message=watch, ready=taken)
    finally:
        await ready.stop()
    assert run.finished["status"] == "success", run.log_text()
    first, second = run.step("first")["outputs"], run.step("second")["outputs"]
    assert first["pid"] != second["pid"]
    assert first["var"] == "set", "a spare step still sees the job's environment"
    assert seen_children, "the runner started step processes"

    # The runner SIGKILLs its spares as it exits; on a loaded machine one may take a moment to be gone.
    async def none_left() -> bool:
        return not any(process_alive(pid) for pid in seen_children)

    await async_wait_until(none_left, timeout=10, what="the job's spare step processes to be gone")


async def test_a_ready_runner_that_is_already_dead_is_replaced_for_the_job(workspace: Path) -> None:
    lock = write_workflow(workspace / "src", WORKFLOW)
    dead = await spawn_runner([sys.executable, "-c", "pass"], runner_env())
    await dead.wait()
    run = await run_job(job_spec(lock), workspace, JobProcess(env=runner_env()), ready=dead)
    assert run.finished["status"] == "success", run.log_text()


async def test_a_variable_read_at_interpreter_start_reaches_the_step(workspace: Path) -> None:
    """A job env that sets `PYTHON*` cannot use a spare started without it: its step starts cold."""
    lock = write_workflow(
        workspace / "src", WORKFLOW.replace('env={"JOB_VAR": "set"}', 'env={"PYTHONDONTWRITEBYTECODE": "1"}')
    )
    run = await run_job(job_spec(lock), workspace)
    assert run.finished["status"] == "success", run.log_text()
    assert run.step("second")["outputs"]["dont_write_bytecode"] == 1


VENV_WORKFLOW = """
import os, sys
from conveyor import workflow, push
w = workflow("w", on=push())
j = w.job("j", runs_on="linux")
@j.step
def use(ctx):
    import tinypkg
    return {"exe": sys.executable, "pid": os.getpid(), "value": tinypkg.VALUE}
"""


def children_started_with(pid: int, python: str) -> set[int]:
    found: set[int] = set()
    for child in psutil.Process(pid).children():
        try:
            if child.cmdline()[:1] == [python]:
                found.add(child.pid)
        except psutil.Error:  # gone meanwhile
            continue
    return found


@pytest.mark.slow
async def test_a_repeat_of_a_job_with_requirements_runs_its_step_in_a_process_started_before_it(
    tmp_path: Path, workspace: Path
) -> None:
    """The next ready runner starts its spares with the venv the last job used, not the agent's interpreter."""
    wheel = build_wheel(tmp_path)
    src = workspace / "src"
    lock = write_workflow(src, VENV_WORKFLOW)
    (src / ".conveyor" / "requirements.txt").write_text(f"--no-index\n{wheel}\n")
    venvs = tmp_path / "venvs"
    first = await run_job(job_spec(lock), workspace, JobProcess(env=runner_env(), venvs_dir=venvs))
    assert first.finished["status"] == "success", first.log_text()
    venv_python = first.step("use")["outputs"]["exe"]
    assert venv_python.startswith(str(venvs))
    repeat = tmp_path / "repeat"
    shutil.copytree(src, repeat / "src")

    ready = ReadyRunner(env=runner_env(), venvs_dir=venvs)
    ready.start()
    try:
        taken = await take_when_started(ready)

        async def venv_spares() -> set[int] | None:
            spares = children_started_with(taken.pid, venv_python)
            return spares if len(spares) >= 2 else None

        spares = await async_wait_until(venv_spares, timeout=30, what="spares started with the venv's python")
        run = await run_job(
            job_spec(lock), repeat, JobProcess(env=runner_env(), venvs_dir=venvs), ready=taken
        )
    finally:
        await ready.stop()
    assert run.finished["status"] == "success", run.log_text()
    outputs = run.step("use")["outputs"]
    assert outputs["value"] == 42 and outputs["exe"] == venv_python
    assert outputs["pid"] in spares, "the step started an interpreter instead of taking a spare"


def test_a_ready_runner_whose_agent_died_before_it_was_ready_exits(tmp_path: Path) -> None:
    """An agent killed while its ready runner starts leaves no runner behind (it used to wait for ever on
    the spares it was starting, in `asyncio.run`'s clean-up)."""
    runner = subprocess.Popen(
        [sys.executable, "-m", "conveyor.agent.runner", "--wait"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=runner_env(),
        start_new_session=True,
    )
    try:
        assert runner.stdin is not None and runner.stdout is not None
        runner.stdout.close()  # as the agent's end of the pipes closes when it is killed
        runner.stdin.close()
        assert runner.wait(timeout=60) == 2
    finally:
        if runner.poll() is None:
            os.killpg(runner.pid, signal.SIGKILL)
            runner.wait()
