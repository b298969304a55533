"""The access log (docs/design/admin.md §5): who did what through the admin API, and who was refused.

Writes and denials are durable (in the change's transaction, or their own); reads are best effort
through a bounded queue written in batches, so a read never fails because of its log row. A token's
`last_used_at` rides along in the same batches: informational, and written by a task the lifespan
stops, never by a stray one racing the shutdown.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import datetime

from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.admin.store import insert_access_rows, touch_token
from conveyor.db.engine import Database
from conveyor.http.deps import AccessEntry
from conveyor.model.errors import ApiError

log = logging.getLogger(__name__)

READ_QUEUE_SIZE = 10_000
READ_BATCH_SIZE = 500


async def write_in_change(conn: AsyncConnection, entry: AccessEntry) -> None:
    """Write a change's row in the change's own transaction (`conveyor.http.log_write`, handed over by the
    admin guard as `AccessLogWrite`); 503 `unavailable` when it cannot be written."""
    try:
        async with conn.begin_nested():
            await insert_access_rows(conn, [entry.as_row()])
    except DBAPIError as exc:
        # Raising rolls the caller's transaction back: no change without its log row. The cause goes to
        # the server's log: the caller's 503 says only that nothing changed.
        log.warning("access log row not written, %s %s rolled back: %s", entry.action, entry.target_type, exc)
        raise ApiError(
            503, "unavailable", "the access log could not be written; nothing was changed"
        ) from exc


class ReadLogWriter:
    """Batches best-effort read rows and token uses; drops (and counts) rows when full or on failure."""

    def __init__(self, db: Database, *, flush_interval_s: float, on_drop: Callable[[int], None]) -> None:
        self._db = db
        self._queue: asyncio.Queue[AccessEntry] = asyncio.Queue(maxsize=READ_QUEUE_SIZE)
        self._flush_interval_s = flush_interval_s
        self._on_drop = on_drop
        self._task: asyncio.Task[None] | None = None
        self._token_uses: dict[str, datetime] = {}
        # One flush at a time: an explicit flush (or stop) waits for a background one that already took
        # rows off the queue, instead of returning before those rows are committed.
        self._flushing = asyncio.Lock()

    def offer(self, entry: AccessEntry) -> None:
        """Queue a row without waiting; a full queue drops it."""
        try:
            self._queue.put_nowait(entry)
        except asyncio.QueueFull:
            log.warning("access log queue full; dropping a read row", extra={"request_id": entry.request_id})
            self._on_drop(1)

    def note_token_use(self, token_id: str, at: datetime) -> None:
        """Record that a token was used; the next flush writes its `last_used_at`."""
        self._token_uses[token_id] = at

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
        """Write everything queued now (after any flush already under way)."""
        async with self._flushing:
            await self._flush()

    async def _flush(self) -> None:
        if self._token_uses:
            uses, self._token_uses = self._token_uses, {}
            try:
                async with self._db.transaction() as conn:
                    for token_id, at in uses.items():
                        await touch_token(conn, token_id, at)
            except Exception as exc:  # best effort: last_used_at is informational
                log.warning("could not record the last use of %d admin tokens: %s", len(uses), exc)
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
            # Shielded: stop() cancelling the loop must not roll back a batch already taken off the queue.
            await asyncio.shield(self.flush())
