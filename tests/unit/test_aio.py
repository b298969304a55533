"""`wait_event`: an event wait with a timeout that never loses its task's cancellation."""

from __future__ import annotations

import asyncio

import pytest

from conveyor.aio import wait_event


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
