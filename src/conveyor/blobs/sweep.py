"""Deleting blobs nothing references (docs/design/artifacts.md §2), run by the leader's retention sweep.

Each blob is deleted inside a transaction that holds its row locked while `doomed`; a put of the same
content marks the row live first (`store.mark_live`) and so waits for that transaction, which is what
makes a concurrent upload and the sweep safe without any lock outside the database.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement
from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.blobs import store
from conveyor.blobs.backend import BlobStore
from conveyor.db.engine import Database

log = logging.getLogger(__name__)

BATCH = 200


@dataclass
class BlobSweep:
    """Dooms unreferenced blobs, deletes doomed and row-less ones, and clears old staging objects."""

    db: Database
    blob_store: BlobStore
    # Columns whose values are blob digests (`artifacts.blob_sha256`, …): a blob one of them names stays.
    references: Sequence[ColumnElement[Any]]
    grace: timedelta
    on_deleted: Callable[[str, int], None] = lambda reason, count: None
    batch: int = BATCH

    async def sweep(
        self, now: datetime, fence: Callable[[AsyncConnection], Awaitable[None]] | None = None
    ) -> dict[str, int]:
        """One pass; returns the blobs deleted per reason."""
        cutoff = now - self.grace
        totals = {"unreferenced": 0, "orphan": 0, "staging": 0}
        while True:
            async with self.db.transaction() as conn:
                marked = await store.doom_unreferenced(conn, self.references, cutoff, self.batch)
                if fence is not None:
                    await fence(conn)
            if marked < self.batch:
                break
            await asyncio.sleep(0)
        while True:
            async with self.db.read() as conn:
                digests = await store.doomed(conn, self.batch)
            deleted = 0
            for sha256 in digests:
                if await self._delete_doomed(sha256, fence):
                    deleted += 1
            totals["unreferenced"] += deleted
            if len(digests) < self.batch:
                break
        totals["orphan"] = await self._orphans(now, cutoff, fence)
        totals["staging"] = await self.blob_store.sweep_staging(cutoff)
        for reason, count in totals.items():
            if count:
                self.on_deleted(reason, count)
        return totals

    async def _delete_doomed(
        self, sha256: str, fence: Callable[[AsyncConnection], Awaitable[None]] | None
    ) -> bool:
        async with self.db.transaction() as conn:
            if not await store.lock_doomed(conn, sha256):
                return False
            if fence is not None:
                await fence(conn)
            await self.blob_store.delete(sha256)
            await store.forget(conn, sha256)
        return True

    async def _orphans(
        self, now: datetime, cutoff: datetime, fence: Callable[[AsyncConnection], Awaitable[None]] | None
    ) -> int:
        old = [found async for found in self.blob_store.list_for_sweep() if found.modified_at < cutoff]
        deleted = 0
        for start in range(0, len(old), self.batch):
            chunk = old[start : start + self.batch]
            async with self.db.read() as conn:
                with_rows = await store.known(conn, [found.sha256 for found in chunk])
            for found in chunk:
                if found.sha256 in with_rows:
                    continue
                async with self.db.transaction() as conn:
                    if not await store.claim_orphan(conn, found.sha256, found.size, now):
                        continue
                    if fence is not None:
                        await fence(conn)
                    await self.blob_store.delete(found.sha256)
                    await store.forget(conn, found.sha256)
                deleted += 1
        return deleted
