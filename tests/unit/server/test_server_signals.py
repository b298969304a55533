"""SIGTERM/SIGINT handling of `conveyor server` (docs/design/cluster.md §8): the first drains, the second
forces."""

from __future__ import annotations

import asyncio
import signal

import uvicorn

from conveyor.server.run import _Server


async def app(scope: object, receive: object, send: object) -> None:
    """Never called: the server is not started."""


def test_the_first_signal_shuts_down_gracefully_and_the_second_sigterm_forces_the_exit() -> None:
    server = _Server(uvicorn.Config(app))
    seen: list[bool] = []
    server.on_signal = seen.append
    server.handle_exit(signal.SIGTERM, None)
    assert server.should_exit and not server.force_exit and seen == [True]
    server.handle_exit(signal.SIGTERM, None)
    assert server.force_exit and seen == [True, False]


async def test_with_work_before_exit_uvicorn_shuts_down_only_once_that_work_is_done() -> None:
    server = _Server(uvicorn.Config(app))
    seen: list[bool] = []
    release = asyncio.Event()
    finished: list[str] = []

    async def running_jobs_finish() -> None:
        await release.wait()
        finished.append("jobs")

    server.on_signal = seen.append
    server.before_exit = running_jobs_finish
    server.handle_exit(signal.SIGTERM, None)
    assert seen == [True], "the first signal drains at once"
    assert not server.should_exit, "the server keeps serving while the work runs"
    release.set()
    assert server._before_exit_task is not None
    await server._before_exit_task
    assert finished == ["jobs"] and server.should_exit and not server.force_exit


async def test_a_second_signal_during_the_work_before_exit_forces_the_exit() -> None:
    server = _Server(uvicorn.Config(app))
    seen: list[bool] = []
    server.on_signal = seen.append
    server.before_exit = asyncio.Event().wait  # never finishes by itself
    server.handle_exit(signal.SIGTERM, None)
    server.handle_exit(signal.SIGTERM, None)
    assert server.should_exit and server.force_exit and seen == [True, False]
    assert server._before_exit_task is not None
    server._before_exit_task.cancel()
