"""One reconnecting LISTEN connection (PostgreSQL) fanning notifications out to in-process handlers.

NOTIFY is only ever a hint in Conveyor: every consumer also polls. So a dropped connection is
logged and re-opened with jittered backoff, and each (re)connect calls `on_connect` so consumers
catch up on whatever was sent while nobody listened.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable, Mapping

from sqlalchemy.engine import make_url

log = logging.getLogger(__name__)

NotificationHandler = Callable[[str], None]


class NotificationListener:
    """LISTEN on `handlers`' channels; call `handlers[channel](payload)` for each notification."""

    def __init__(
        self,
        url: str,
        handlers: Mapping[str, NotificationHandler],
        *,
        name: str,
        on_connect: Callable[[], None] = lambda: None,
        on_lost: Callable[[Exception], None] = lambda _exc: None,
        max_backoff_s: float = 30.0,
    ) -> None:
        self.conninfo = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
        self.handlers = dict(handlers)
        self.name = name
        self.on_connect = on_connect
        self.on_lost = on_lost
        self.max_backoff_s = max_backoff_s
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    async def start(self) -> None:
        """Begin listening in the background."""
        self._task = asyncio.create_task(self._run(), name=self.name)

    async def stop(self) -> None:
        """Stop listening."""
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            # psycopg may turn the cancellation into its own error; `_stopping` ends the loop then.
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        import psycopg

        delay = 0.5
        while not self._stopping:
            try:
                async with await psycopg.AsyncConnection.connect(self.conninfo, autocommit=True) as conn:
                    for channel in self.handlers:
                        await conn.execute(f"LISTEN {channel}")
                    delay = 0.5
                    self.on_connect()
                    async for note in conn.notifies():
                        handler = self.handlers.get(note.channel)
                        if handler is not None:
                            handler(note.payload)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if self._stopping:
                    return
                self.on_lost(exc)
                log.warning("%s: LISTEN connection lost (%s); reconnecting", self.name, exc)
            # Full-jitter backoff between reconnects (not synchronisation).
            await asyncio.sleep(random.uniform(0, delay))
            delay = min(self.max_backoff_s, delay * 2)
