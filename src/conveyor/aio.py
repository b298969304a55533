"""asyncio helpers shared by the servers and the agent (imports nothing of Conveyor's)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterable, Callable
from typing import IO, Protocol, TypeVar

T = TypeVar("T")


async def wait_event(event: asyncio.Event, timeout_s: float | None) -> bool:
    """Wait until `event` is set or `timeout_s` passed; whether it was set.

    Not `asyncio.wait_for(event.wait(), …)`: on Python 3.11 that swallows a cancellation arriving in the
    same loop iteration as the event, so a loop cancelled by its `stop()` would run (and be waited for)
    for ever.
    """
    waiter = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait({waiter}, timeout=timeout_s)
    finally:
        waiter.cancel()
    return event.is_set()


async def read_ahead(read: Callable[[], T | None]) -> AsyncGenerator[T, None]:
    """The results of `read()`, each called in a worker thread, until one is None or empty.

    The next call starts before the current result is handed over, so a blocking read (a file, hashing)
    overlaps whatever the consumer does with the previous result (sending it): a stream then moves at
    the slower of the two rather than their sum. When the consumer stops early, the call in flight is
    waited for (the thread must not outlive the file it reads).
    """
    pending = asyncio.ensure_future(asyncio.to_thread(read))
    try:
        while True:
            result = await pending
            if not result:
                return
            pending = asyncio.ensure_future(asyncio.to_thread(read))
            yield result
    finally:
        if not pending.done():
            await asyncio.wait({pending})
        if not pending.cancelled():
            pending.exception()  # retrieved: an error after the consumer left is not logged as lost


class WriteBehind:
    """Blocking calls (writing, hashing) run in a worker thread one at a time, each started without
    waiting for it: the caller receives its next block while the previous one is written. `submit`
    waits for the call before it (and raises its error); `drain` waits for the last one; `settle` waits
    without raising, for error paths that must not close a file under a running write."""

    def __init__(self) -> None:
        self._pending: asyncio.Future[None] | None = None

    async def submit(self, call: Callable[..., None], *args: object) -> None:
        """Wait for the previous call, then start `call(*args)` in a worker thread."""
        await self.drain()
        self._pending = asyncio.ensure_future(asyncio.to_thread(call, *args))

    async def drain(self) -> None:
        """Wait for the call in flight; its error propagates."""
        pending, self._pending = self._pending, None
        if pending is not None:
            await pending

    async def settle(self) -> None:
        """Wait for the call in flight, ignoring its outcome."""
        pending, self._pending = self._pending, None
        if pending is not None:
            await asyncio.wait({pending})
            if not pending.cancelled():
                pending.exception()


class Digest(Protocol):
    """What `write_hashed` feeds: a `hashlib` object, or anything with its `update`."""

    def update(self, data: bytes, /) -> None: ...


async def write_hashed(
    chunks: AsyncIterable[bytes], handle: IO[bytes], digest: Digest, block_bytes: int
) -> None:
    """Write `chunks` to `handle` and feed them to `digest`, about `block_bytes` at a time in a worker thread
    while the next ones arrive (a `WriteBehind`). The pieces are gathered, not joined: no copy. The write
    in flight is waited for before an error propagates, so the caller may close `handle` then."""
    writer = WriteBehind()
    try:
        pieces: list[bytes] = []
        gathered = 0
        async for piece in chunks:
            pieces.append(piece)
            gathered += len(piece)
            if gathered >= block_bytes:
                await writer.submit(_write_hashed, handle, digest, pieces)
                pieces, gathered = [], 0
        if pieces:
            await writer.submit(_write_hashed, handle, digest, pieces)
        await writer.drain()
    finally:
        await writer.settle()


def _write_hashed(handle: IO[bytes], digest: Digest, pieces: list[bytes]) -> None:
    for piece in pieces:
        digest.update(piece)
        handle.write(piece)
