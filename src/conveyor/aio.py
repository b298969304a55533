"""asyncio helpers shared by the servers and the agent (imports nothing of Conveyor's)."""

from __future__ import annotations

import asyncio


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
