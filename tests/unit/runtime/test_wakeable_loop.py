"""The wake-or-poll loop behind the dispatcher, the status reporter and the delivery recovery scan."""

import asyncio
import logging

from conveyor.runtime.loops import WakeableLoop

LOG = logging.getLogger("test")


async def test_a_wake_runs_a_round_long_before_the_poll() -> None:
    rounds = asyncio.Queue[int]()
    count = 0

    async def round_() -> None:
        nonlocal count
        count += 1
        await rounds.put(count)

    loop = WakeableLoop("test", round_, poll_s=3600, log=LOG)
    await loop.start()
    assert await asyncio.wait_for(rounds.get(), 5) == 1  # at start
    loop.wake()
    assert await asyncio.wait_for(rounds.get(), 5) == 2  # woken, not polled (the poll is an hour)
    await loop.stop()


async def test_a_failing_round_does_not_stop_the_loop() -> None:
    rounds = asyncio.Queue[int]()
    calls = 0

    async def round_() -> None:
        nonlocal calls
        calls += 1
        await rounds.put(calls)
        if calls == 1:
            raise RuntimeError("boom")

    loop = WakeableLoop("test", round_, poll_s=3600, log=LOG)
    await loop.start()
    await asyncio.wait_for(rounds.get(), 5)
    loop.wake()
    assert await asyncio.wait_for(rounds.get(), 5) == 2
    await loop.stop()
