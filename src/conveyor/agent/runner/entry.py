"""The runner's entry point: read the placement and the spec, run the job, exit without waiting for
leftover tasks."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import json
import os
import signal
import sys
import traceback
from pathlib import Path

from conveyor.agent.container_plan import engine_address, engine_may_answer
from conveyor.agent.runner.job import Runner
from conveyor.agent.runner.policy import allowlisted_environment, bootstrap_environment
from conveyor.agent.runner.protocol import Emitter, Placement, mirrors_of, placement_of, stdin_reader
from conveyor.agent.spec import JobSpec
from conveyor.agent.step_spare import StepSpares
from conveyor.heap import freeze_startup_heap


async def _preload_engine_client() -> None:
    """A runner waiting for its job on a host with an engine imports the engine client (aiodocker, ~160 ms)
    before it says it is ready, in a thread while its spares start: a container job's setup then starts its
    containers at once, and the wait is the agent's idle time. A host without an engine never pays for it."""
    try:
        await asyncio.to_thread(importlib.import_module, "conveyor.agent.containers")
    except Exception as problem:  # the job that needs it reports the failure; a host job does not care
        print(f"conveyor runner: importing the engine client: {problem!r}", file=sys.stderr)


async def main_async(placement: Placement | None, spare_python: str | None = None) -> int:
    """Read the spec, run the job, report; exit 0 whenever `job.finished` was written.

    Without a placement (`--wait`, a runner started before its job) the first line is
    `{"workspace": ..., "venvs": ..., "mirrors": ..., "mirror_max_bytes": ...}` and the spec follows it.
    """
    spares = StepSpares(Path("/"))
    # Before a job is known: the job's own variables come with each step's `run`.
    # `spare_python`: the requirements venv of the agent's last job, which a repeat of that job will want.
    spares.refill(
        spare_python or sys.executable,
        bootstrap_environment(allowlisted_environment(os.environ), os.environ),
    )
    stdin = await stdin_reader()
    if placement is None and engine_may_answer(engine_address(os.environ)):
        # Its spares too, while they wait: else the first one a container job takes (the setup's inspection)
        # would import the client only then, with the job waiting behind it.
        spares.prepare_for_containers()
        await _preload_engine_client()
    freeze_startup_heap()
    if placement is None:
        try:
            sys.stdout.write(json.dumps({"type": "ready"}) + "\n")
            sys.stdout.flush()
        except BrokenPipeError:  # the agent that started this runner is gone
            await spares.close()
            return 2
        envelope = await stdin.readline()
        if not envelope:  # the agent no longer needs this ready runner
            await spares.close()
            return 2
        placement = placement_of(envelope)
    first = await stdin.readline()
    if not first:
        print("conveyor runner: no job spec on stdin", file=sys.stderr)
        await spares.close()
        return 2
    spec = JobSpec.model_validate_json(first)
    runner = Runner(
        spec,
        placement.workspace,
        emit=Emitter(sys.stdout, spec.job_id),
        venvs_dir=placement.venvs_dir,
        spares=spares,
        mirrors=placement.mirrors,
    )
    control = asyncio.create_task(runner._read_control(stdin))
    loop = asyncio.get_running_loop()
    # A runner told to stop by its parent cancels its job gracefully; a second signal forces.
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, lambda: runner.request_cancel(runner.cancel is not None))
    try:
        await runner.run()
    finally:
        control.cancel()
        await runner.remove_containers()
        await spares.close()
        runner.kill_leftovers()
    return 0


def main(argv: list[str] | None = None) -> None:
    """Entry point of `python -m conveyor.agent.runner`."""
    parser = argparse.ArgumentParser(prog="python -m conveyor.agent.runner")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--workspace", type=Path)
    where.add_argument("--wait", action="store_true", help="start now; the workspace comes on stdin")
    parser.add_argument("--venvs", type=Path, default=None)
    parser.add_argument("--mirrors", type=Path, default=None, help="check out through mirrors kept here")
    parser.add_argument("--mirror-max-bytes", type=int, default=None)
    parser.add_argument("--spare-python", default=None, help="start the spare step processes with this")
    options = parser.parse_args(argv)
    placement = (
        None
        if options.wait
        else Placement(
            options.workspace.resolve(), options.venvs, mirrors_of(options.mirrors, options.mirror_max_bytes)
        )
    )
    # Not `asyncio.run`: its clean-up cancels leftover tasks and waits for them, and one cancelled inside
    # `create_subprocess_exec` (a spare still starting) can wait for ever on Python 3.11. `os._exit`
    # ends them all; the spares' own sessions end when their control channels close.
    loop = asyncio.new_event_loop()
    try:
        code = loop.run_until_complete(main_async(placement, options.spare_python))
    except BaseException:  # as an uncaught exception ends a program, without waiting for leftover tasks
        traceback.print_exc()
        code = 1
    with contextlib.suppress(OSError):
        sys.stdout.flush()
    os._exit(code)
