"""Live follow in one process: appends wake the stream at once; keep-alives; `end` closes it."""

from __future__ import annotations

import asyncio
import json

from conveyor.db.engine import Database
from conveyor.execution.log_service import LogService
from conveyor.model.protocol import LogChunk, LogLine
from tests.integration.execution.conftest import finish_job, insert_job
from tests.support.waiting import async_wait_until


def chunk(job_id: str, seq: int, *texts: str) -> LogChunk:
    return LogChunk(job_id=job_id, step_index=1, seq=seq, lines=[LogLine(text=t) for t in texts])


async def test_an_append_reaches_a_follower_through_the_in_process_signal(database: Database) -> None:
    job = await insert_job(database, step_names={1: "build"})
    # A poll far longer than the test's patience: only the wake-up can deliver the line in time.
    service = LogService(database, keepalive_s=60, poll_s=60)
    frames: list[str] = []

    async def consume() -> None:
        async for frame in service.follow(job.job_id, step=1, offset=0):
            frames.append(frame)

    follower = asyncio.create_task(consume())
    try:
        await async_wait_until(
            lambda: _true_async(any("event: step" in f for f in frames)), timeout=5, what="the step event"
        )
        result = await service.append(chunk(job.job_id, 0, "first line"), secrets=())
        assert result.stored
        await async_wait_until(
            lambda: _true_async(any("first line" in f for f in frames)), timeout=3, what="the line"
        )
        assert not follower.done()
        await finish_job(database, job.job_id)
        service.job_changed(job.job_id)
        await asyncio.wait_for(follower, timeout=3)
    finally:
        follower.cancel()
    assert frames[-1] == 'event: end\ndata: {"status":"success"}\n\n'


async def test_an_idle_stream_sends_keep_alive_comments(database: Database) -> None:
    job = await insert_job(database, step_names={1: "build"})
    service = LogService(database, keepalive_s=0.05, poll_s=0.02)
    stream = service.follow(job.job_id, step=None, offset=0)
    try:
        first = await asyncio.wait_for(anext(stream), timeout=5)
        assert "event: step" in first
        assert await asyncio.wait_for(anext(stream), timeout=5) == ": keep-alive\n\n"
    finally:
        await stream.aclose()


async def test_a_masked_line_reaches_the_follower_masked(database: Database) -> None:
    job = await insert_job(database, step_names={1: "build"})
    service = LogService(database, keepalive_s=60, poll_s=0.05)
    await service.append(chunk(job.job_id, 0, "key=abcd1234"), secrets=["abcd1234"])
    await finish_job(database, job.job_id)
    frames = [frame async for frame in service.follow(job.job_id, step=1, offset=0)]
    logs = [json.loads(f.split("data: ")[1]) for f in "".join(frames).split("\n\n") if "event: log" in f]
    assert [d["text"] for d in logs] == ["key=***"]


async def _true_async(value: bool) -> bool:
    return value


async def test_a_follower_is_told_when_another_attempts_log_becomes_the_jobs_and_gets_it_from_its_start(
    database: Database,
) -> None:
    job = await insert_job(database, step_names={1: "build"})
    service = LogService(database, keepalive_s=60, poll_s=60)
    first = LogChunk(job_id=job.job_id, step_index=1, seq=0, lines=[LogLine(text="first run")], attempt=1)
    await service.append(first)
    frames: list[str] = []

    async def consume() -> None:
        async for frame in service.follow(job.job_id, step=1, offset=0):
            frames.append(frame)

    follower = asyncio.create_task(consume())
    try:
        await async_wait_until(
            lambda: _true_async(any("first run" in f for f in frames)), timeout=5, what="the first run's line"
        )
        # The job ran again (it went back to the queue): the second execution's log is the job's now.
        again = LogChunk(job_id=job.job_id, step_index=1, seq=0, lines=[LogLine(text="run again")], attempt=2)
        assert (await service.append(again)).stored
        await async_wait_until(
            lambda: _true_async(any("run again" in f for f in frames)),
            timeout=3,
            what="the second run's line",
        )
        await finish_job(database, job.job_id)
        service.job_changed(job.job_id)
        await asyncio.wait_for(follower, timeout=3)
    finally:
        follower.cancel()
    events = [f for f in "".join(frames).split("\n\n") if "event: log" in f or "event: attempt" in f]
    assert [json.loads(f.split("data: ")[1]).get("text", "attempt") for f in events] == [
        "first run",
        "attempt",
        "run again",
    ]
    assert 'event: attempt\ndata: {"attempt":2,"hop":0}' in "".join(frames)
