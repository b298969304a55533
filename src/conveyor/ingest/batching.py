"""Group commit of webhook deliveries: concurrent deliveries share one durable commit.

A durable commit costs the same for one row as for a hundred (one WAL fsync on PostgreSQL, one WAL
append on SQLite), and one connection does a few hundred of them per second. So the webhook route does
not commit its own row: it hands the row to the `DeliveryWriter` and waits for it. The writer commits
whatever is waiting as one transaction; while that commit is in flight the next arrivals queue up, and
the next commit takes them all (`db/write_batching.py`'s `GroupCommit`). Nothing waits for company: a delivery arriving at an idle writer is
committed at once, alone, so a single client pays no extra latency.

Each caller still gets its answer only after *its* row committed, and durability is the database's
own (WAL `synchronous=NORMAL` on SQLite, `synchronous_commit=on` on PostgreSQL; nothing here changes
either). A row the database rejects fails its batch's transaction: the writer then stores each member
of that batch in a transaction of its own, so its neighbours commit and only that one caller gets the
error.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.db.write_batching import GroupCommit, Waiting
from conveyor.ingest import store
from conveyor.ingest.store import NewDelivery

# One commit carries at most this many rows and this many body bytes (a burst of 25 MiB payloads
# must not become one giant transaction), and always at least one row.
MAX_BATCH_ROWS = 256
MAX_BATCH_BYTES = 8 * 1024 * 1024


def take_batch(
    sizes: Sequence[int], *, max_rows: int = MAX_BATCH_ROWS, max_bytes: int = MAX_BATCH_BYTES
) -> int:
    """How many of the waiting deliveries (their body sizes, oldest first) the next commit takes.

    The longest prefix within `max_rows` rows and `max_bytes` bytes, and at least one whatever its
    size (a delivery bigger than `max_bytes` commits alone); none when nothing waits.
    """
    taken = 0
    total = 0
    for size in sizes:
        if taken == max_rows or (taken > 0 and total + size > max_bytes):
            break
        taken += 1
        total += size
    return taken


@dataclass
class DeliveryWriter(GroupCommit[NewDelivery, tuple[str, bool]]):
    """Stores deliveries with group commit; `store` returns once the delivery's row is durable."""

    max_rows: int = MAX_BATCH_ROWS
    max_bytes: int = MAX_BATCH_BYTES

    async def store(self, delivery: NewDelivery) -> tuple[str, bool]:
        """(row id, created) once the row is committed; raises what storing *this* delivery raised."""
        return await self.submit(delivery)

    async def _write(self, conn: AsyncConnection, items: list[NewDelivery]) -> list[tuple[str, bool]]:
        return await store.insert_deliveries(conn, items)

    def _take(self, waiting: deque[Waiting[NewDelivery, tuple[str, bool]]]) -> int:
        return take_batch(
            [len(w.item.body) for w in waiting], max_rows=self.max_rows, max_bytes=self.max_bytes
        )
