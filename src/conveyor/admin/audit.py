"""The access log (admin.md §5): who did what through the admin API, and who was refused.

Writes and denials are durable (in the change's transaction, or their own); reads are best effort
through a bounded queue written in batches, so a read never fails because of its log row.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from conveyor.admin.store import insert_access_rows
from conveyor.db.engine import Database
from conveyor.http.deps import AccessEntry

log = logging.getLogger("conveyor.admin.audit")

READ_QUEUE_SIZE = 10_000
READ_BATCH_SIZE = 500


class ReadLogWriter:
    """Batches best-effort read rows; drops (and counts) them when full or when the insert fails."""

    def __init__(self, db: Database, *, flush_interval_s: float, on_drop: Callable[[int], None]) -> None:
        self._db = db
        self._queue: asyncio.Queue[AccessEntry] = asyncio.Queue(maxsize=READ_QUEUE_SIZE)
        self._flush_interval_s = flush_interval_s
        self._on_drop = on_drop
        self._task: asyncio.Task[None] | None = None

    def offer(self, entry: AccessEntry) -> None:
        """Queue a row without waiting; a full queue drops it."""
        try:
            self._queue.put_nowait(entry)
        except asyncio.QueueFull:
            log.warning("access log queue full; dropping a read row", extra={"request_id": entry.request_id})
            self._on_drop(1)

    def start(self) -> None:
        """Start the background flusher."""
        self._task = asyncio.create_task(self._run(), name="access-log-writer")

    async def stop(self) -> None:
        """Flush what is queued and stop."""
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        await self.flush()

    async def flush(self) -> None:
        """Write everything queued now."""
        while not self._queue.empty():
            batch = [self._queue.get_nowait() for _ in range(min(READ_BATCH_SIZE, self._queue.qsize()))]
            try:
                async with self._db.transaction() as conn:
                    await insert_access_rows(conn, [e.as_row() for e in batch])
            except Exception:
                log.exception("could not write %d access-log read rows; dropped", len(batch))
                self._on_drop(len(batch))
                return

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._flush_interval_s)
            await self.flush()
