"""Group commit of webhook deliveries: concurrent deliveries share one durable commit.

A durable commit costs the same for one row as for a hundred (one WAL fsync on PostgreSQL, one WAL
append on SQLite), and one connection does a few hundred of them per second. So the webhook route does
not commit its own row: it hands the row to the `DeliveryWriter` and waits for it. The writer commits
whatever is waiting as one transaction; while that commit is in flight the next arrivals queue up, and
the next commit takes them all. Nothing waits for company: a delivery arriving at an idle writer is
committed at once, alone, so a single client pays no extra latency.

Each caller still gets its answer only after *its* row committed, and durability is the database's
own (WAL `synchronous=NORMAL` on SQLite, `synchronous_commit=on` on PostgreSQL; nothing here changes
either). A row the database rejects fails its batch's transaction: the writer then stores each member
of that batch in a transaction of its own, so its neighbours commit and only that one caller gets the
error.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from conveyor.db.engine import Database
from conveyor.ingest import store
from conveyor.ingest.store import NewDelivery

log = logging.getLogger("conveyor.ingest.batching")

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
class _Waiting:
    delivery: NewDelivery
    answer: asyncio.Future[tuple[str, bool]]


@dataclass
class DeliveryWriter:
    """Stores deliveries with group commit; `store` returns once the delivery's row is durable."""

    db: Database
    max_rows: int = MAX_BATCH_ROWS
    max_bytes: int = MAX_BATCH_BYTES
    # The size of every batch committed or tried, newest last (bounded): what tests and diagnostics see.
    batch_sizes: deque[int] = field(default_factory=lambda: deque(maxlen=1000), init=False)
    _queue: deque[_Waiting] = field(default_factory=deque, init=False)
    _task: asyncio.Task[None] | None = field(default=None, init=False)

    async def store(self, delivery: NewDelivery) -> tuple[str, bool]:
        """(row id, created) once the row is committed; raises what storing *this* delivery raised."""
        answer: asyncio.Future[tuple[str, bool]] = asyncio.get_running_loop().create_future()
        self._queue.append(_Waiting(delivery, answer))
        if self._task is None or self._task.done():
            # The writer runs while there is work and ends when the queue is empty.
            self._task = asyncio.get_running_loop().create_task(self._write_all(), name="delivery-writer")
        # Shielded: a caller that goes away (client disconnect) must not cancel a commit others share.
        return await asyncio.shield(answer)

    async def _write_all(self) -> None:
        while self._queue:
            count = take_batch(
                [len(w.delivery.body) for w in self._queue], max_rows=self.max_rows, max_bytes=self.max_bytes
            )
            batch = [self._queue.popleft() for _ in range(count)]
            self.batch_sizes.append(len(batch))
            try:
                await self._commit(batch)
            except Exception as exc:  # never leave a caller waiting, whatever failed
                log.exception("storing a batch of %d deliveries failed", len(batch))
                for waiting in batch:
                    _settle(waiting, error=exc)

    async def _commit(self, batch: list[_Waiting]) -> None:
        try:
            async with self.db.transaction() as conn:
                results = await store.insert_deliveries(conn, [w.delivery for w in batch])
        except Exception as exc:
            if len(batch) == 1:
                _settle(batch[0], error=exc)
                return
            log.warning(
                "a batch of %d deliveries failed (%s); storing each on its own",
                len(batch),
                exc.__class__.__name__,
            )
            for waiting in batch:
                await self._commit_alone(waiting)
            return
        for waiting, result in zip(batch, results, strict=True):
            _settle(waiting, result=result)

    async def _commit_alone(self, waiting: _Waiting) -> None:
        self.batch_sizes.append(1)
        try:
            async with self.db.transaction() as conn:
                result = await store.insert_delivery(conn, waiting.delivery)
        except Exception as exc:
            _settle(waiting, error=exc)
        else:
            _settle(waiting, result=result)


def _settle(
    waiting: _Waiting, *, result: tuple[str, bool] | None = None, error: BaseException | None = None
) -> None:
    if waiting.answer.done():
        return
    if error is not None:
        waiting.answer.set_exception(error)
    else:
        assert result is not None
        waiting.answer.set_result(result)
