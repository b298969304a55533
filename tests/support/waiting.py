"""Waiting on conditions with deadlines (never bare sleeps as synchronisation)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

T = TypeVar("T")

# The first polls come quickly (most conditions hold within a few hundred ms), then they space out:
# each poll is usually an HTTP request that costs a server CPU, and on the suite's 2 loaded cores a
# 20-per-second poll of every waiting test slowed the servers it was waiting for.
FIRST_POLL_S = 0.02
MAX_POLL_S = 0.25


def poll_intervals() -> Iterator[float]:
    """0.02 s, growing by half each poll, up to 0.25 s."""
    interval = FIRST_POLL_S
    while True:
        yield interval
        interval = min(interval * 1.5, MAX_POLL_S)


def wait_until(condition: Callable[[], T], *, timeout: float = 10.0, what: str = "condition") -> T:
    """Poll `condition` until it returns a truthy value; fail with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    intervals = poll_intervals()
    while time.monotonic() < deadline:
        try:
            value = condition()
            if value:
                return value
        except Exception as exc:  # the condition may fail until the thing it checks exists
            last_error = exc
        time.sleep(min(next(intervals), max(0.0, deadline - time.monotonic())))
    raise AssertionError(
        f"timed out after {timeout}s waiting for {what}"
        + (f" (last error: {last_error})" if last_error else "")
    )


async def async_wait_until(
    condition: Callable[[], Awaitable[T]], *, timeout: float = 10.0, what: str = "condition"
) -> T:
    """Async twin of `wait_until`."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    intervals = poll_intervals()
    while time.monotonic() < deadline:
        try:
            value = await condition()
            if value:
                return value
        except Exception as exc:
            last_error = exc
        await asyncio.sleep(min(next(intervals), max(0.0, deadline - time.monotonic())))
    raise AssertionError(
        f"timed out after {timeout}s waiting for {what}"
        + (f" (last error: {last_error})" if last_error else "")
    )
