"""A background loop that does one round now, then whenever woken, or after `poll_s` at the latest.

Wake-ups (NOTIFY, in-process signals) are hints; the poll is the fallback that keeps the row the
only truth. A failing round is logged and the loop goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from conveyor.aio import wait_event


class WakeableLoop:
    """Runs `round_` repeatedly in one task: at start, on `wake()`, and every `poll_s`."""

    def __init__(
        self, name: str, round_: Callable[[], Awaitable[Any]], poll_s: float, log: logging.Logger
    ) -> None:
        self._name = name
        self._round = round_
        self._poll_s = poll_s
        self._log = log
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def wake(self) -> None:
        """Run a round soon."""
        self._wake.set()

    async def start(self) -> None:
        """Begin looping."""
        self._task = asyncio.create_task(self._run(), name=self._name)

    async def stop(self) -> None:
        """Stop looping (a round in progress is cancelled)."""
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            self._wake.clear()
            try:
                await self._round()
            except Exception:
                self._log.exception("%s round failed", self._name)
            await wait_event(self._wake, self._poll_s)
