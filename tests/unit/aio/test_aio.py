"""`wait_event`: an event wait with a timeout that never loses its task's cancellation; `read_ahead` and
`WriteBehind`: blocking reads and writes in a worker thread, overlapped with what the caller does."""

from __future__ import annotations

import asyncio
import hashlib
import io
import threading
from collections.abc import AsyncIterator

import pytest

from conveyor.aio import WriteBehind, read_ahead, wait_event, write_hashed


async def test_it_says_whether_the_event_was_set() -> None:
    event = asyncio.Event()
    assert await wait_event(event, 0.01) is False
    event.set()
    assert await wait_event(event, 10) is True


async def test_a_cancel_in_the_same_turn_as_the_event_still_cancels() -> None:
    """The race that made a stopping loop run for ever with `asyncio.wait_for` on Python 3.11."""
    for _ in range(20):
        event = asyncio.Event()
        task = asyncio.create_task(wait_event(event, 10))
        await asyncio.sleep(0)
        await asyncio.sleep(0)  # the waiter is now waiting on the event
        event.set()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_no_waiter_task_is_left_behind() -> None:
    before = len(asyncio.all_tasks())
    await wait_event(asyncio.Event(), 0.01)
    await asyncio.sleep(0)
    assert len(asyncio.all_tasks()) == before


# -- read_ahead and WriteBehind: blocking I/O in a worker thread, overlapped with the caller ----------


async def test_read_ahead_yields_each_read_in_order_and_starts_the_next_before_handing_one_over() -> None:
    blocks = iter([b"one", b"two", b"three", b""])
    second_started = threading.Event()
    calls = 0

    def read() -> bytes:
        nonlocal calls
        calls += 1
        if calls == 2:
            second_started.set()
        return next(blocks)

    seen = []
    async for block in read_ahead(read):
        if block == b"one":
            # The consumer still holds the first block: the second read is already under way.
            assert await asyncio.to_thread(second_started.wait, 10)
        seen.append(block)
    assert seen == [b"one", b"two", b"three"]


async def test_read_ahead_closed_early_waits_for_the_read_in_flight() -> None:
    release = threading.Event()
    finished: list[bytes] = []

    def read() -> bytes:
        if finished:
            release.wait(10)
        finished.append(b"block")
        return b"block"

    reader = read_ahead(read)
    assert await anext(reader) == b"block"  # the second read is now in flight, held
    closing = asyncio.create_task(reader.aclose())
    done, _ = await asyncio.wait({closing}, timeout=0.2)
    assert not done, "the reader closed while its read still ran (the file would be closed under it)"
    release.set()
    await closing
    assert len(finished) == 2


async def test_write_behind_runs_calls_in_order_one_at_a_time_and_reports_an_error_at_the_next_wait() -> None:
    running = 0
    order: list[int] = []

    def write(value: int) -> None:
        nonlocal running
        running += 1
        assert running == 1
        order.append(value)
        running -= 1
        if value == 3:
            raise OSError("disk full")

    writer = WriteBehind()
    for value in (1, 2, 3):
        await writer.submit(write, value)
    with pytest.raises(OSError, match="disk full"):
        await writer.drain()
    await writer.drain()  # the error was reported once
    assert order == [1, 2, 3]

    await writer.submit(write, 3)
    await writer.settle()  # waits, and keeps quiet: an error path is already raising its own
    await writer.submit(write, 4)
    await writer.drain()
    assert order == [1, 2, 3, 3, 4]


class Recorder(io.BytesIO):
    """A file that records the size of each write, each held until `release` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[int] = []
        self.started = threading.Event()
        self.release = threading.Event()
        self.release.set()

    def write(self, data: bytes, /) -> int:  # type: ignore[override]
        self.started.set()
        self.release.wait()
        self.calls.append(len(data))
        return super().write(data)


async def test_write_hashed_writes_and_hashes_every_piece_in_order_in_blocks_of_about_the_size() -> None:
    pieces = [bytes([n]) * 300 for n in range(10)]

    async def chunks() -> AsyncIterator[bytes]:
        for piece in pieces:
            yield piece

    out, digest = Recorder(), hashlib.sha256()
    await write_hashed(chunks(), out, digest, block_bytes=1000)
    assert out.getvalue() == b"".join(pieces)
    assert digest.hexdigest() == hashlib.sha256(b"".join(pieces)).hexdigest()
    # Gathered, not joined: each piece is written as it came (no copy into one block).
    assert out.calls == [300] * 10


async def test_write_hashed_waits_for_the_write_in_flight_before_the_sources_error_propagates() -> None:
    out = Recorder()
    out.release.clear()

    async def chunks() -> AsyncIterator[bytes]:
        yield b"x" * 2000
        raise OSError("the connection broke")

    task = asyncio.ensure_future(write_hashed(chunks(), out, hashlib.sha256(), block_bytes=1000))
    await asyncio.to_thread(out.started.wait)
    # The source has failed, but the write is still running: the error waits for it.
    done, _ = await asyncio.wait({task}, timeout=0.2)
    assert not done
    out.release.set()
    with pytest.raises(OSError, match="the connection broke"):
        await task
    assert out.calls == [2000]
