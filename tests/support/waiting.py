"""Waiting on conditions with deadlines (never bare sleeps as synchronisation)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

POLL_S = 0.05


def wait_until(condition: Callable[[], T], *, timeout: float = 10.0, what: str = "condition") -> T:
    """Poll `condition` until it returns a truthy value; fail with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = condition()
            if value:
                return value
        except Exception as exc:  # the condition may fail until the thing it checks exists
            last_error = exc
        time.sleep(POLL_S)
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
    while time.monotonic() < deadline:
        try:
            value = await condition()
            if value:
                return value
        except Exception as exc:
            last_error = exc
        await asyncio.sleep(POLL_S)
    raise AssertionError(
        f"timed out after {timeout}s waiting for {what}"
        + (f" (last error: {last_error})" if last_error else "")
    )
