"""Group commit for small writes: concurrent callers' writes share one transaction and one commit.

A transaction's fixed cost (a pooled connection, `BEGIN`, the commit's WAL write or fsync and, on
SQLite, the process's write turn) is paid once for the lot instead of once per caller. A caller hands
over a *unit*, an async function that does its statements on the connection it is given, and gets the
unit's result once the transaction holding it has committed. Nothing waits for company: a unit arriving
at an idle batcher commits at once, alone; units arriving while a commit is in flight form the next one.

A unit that raises makes its transaction roll back; the batch is then run again one unit per
transaction, so its neighbours commit and only that caller gets the error. A unit may therefore run
more than once, and must do nothing outside the database (its effects before a rollback are undone).
Units are short, independent writes (a lease, an outcome): one that waited on another unit's rows
would wait on itself.

The mechanism itself (a queue, one writer task at a time, the retry one by one) is `GroupCommit`; the
webhook route's `DeliveryWriter` (`ingest/batching.py`) uses it too, writing a batch of deliveries as
one multi-row insert.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.db.engine import Database

log = logging.getLogger(__name__)

T = TypeVar("T")
Item = TypeVar("Item")
Result = TypeVar("Result")
Unit = Callable[[AsyncConnection], Awaitable[T]]

MAX_BATCH_UNITS = 64


@dataclass
class Waiting(Generic[Item, Result]):
    """A submitted item and the future its caller awaits."""

    item: Item
    answer: asyncio.Future[Result]


@dataclass
class GroupCommit(Generic[Item, Result]):
    """The mechanism: items handed to `submit` are written in shared transactions, each caller answered
    once its item's transaction committed. Subclasses say how a batch is written (`_write`) and, if they
    bound it otherwise than by count, how many waiting items the next transaction takes (`_take`)."""

    db: Database
    # How many items each transaction carried (bounded, newest last): what tests and diagnostics see.
    batch_sizes: deque[int] = field(default_factory=lambda: deque(maxlen=1000), init=False)
    _queue: deque[Waiting[Item, Result]] = field(default_factory=deque, init=False)
    _task: asyncio.Task[None] | None = field(default=None, init=False)

    async def _write(self, conn: AsyncConnection, items: list[Item]) -> list[Result]:
        """Write `items` in the open transaction; one result per item, in order."""
        raise NotImplementedError

    def _take(self, waiting: deque[Waiting[Item, Result]]) -> int:
        """How many of the waiting items (oldest first) the next transaction takes; at least one."""
        return len(waiting)

    async def submit(self, item: Item) -> Result:
        """The item's result once its transaction committed; raises what writing *this* item raised."""
        answer: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        self._queue.append(Waiting(item, answer))
        if self._task is None or self._task.done():
            # The writer runs while there is work and ends when the queue is empty.
            self._task = asyncio.get_running_loop().create_task(
                self._write_all(), name=f"group-commit:{type(self).__name__}"
            )
        # Shielded: a caller that goes away must not cancel a transaction other callers share.
        return await asyncio.shield(answer)

    async def _write_all(self) -> None:
        while self._queue:
            count = max(1, self._take(self._queue))
            batch = [self._queue.popleft() for _ in range(min(count, len(self._queue)))]
            self.batch_sizes.append(len(batch))
            try:
                await self._commit(batch)
            except asyncio.CancelledError:  # shutting down: nobody is left waiting
                for waiting in (*batch, *self._queue):
                    waiting.answer.cancel()
                self._queue.clear()
                raise
            except Exception as exc:  # never leave a caller waiting, whatever failed
                log.exception("a batch of %d writes failed", len(batch))
                for waiting in batch:
                    _settle(waiting, error=exc)

    async def _commit(self, batch: list[Waiting[Item, Result]]) -> None:
        try:
            async with self.db.transaction() as conn:
                results = await self._write(conn, [w.item for w in batch])
        except Exception as exc:
            if len(batch) == 1:
                _settle(batch[0], error=exc)
                return
            log.warning(
                "a batch of %d writes failed (%s); writing each on its own", len(batch), type(exc).__name__
            )
            for waiting in batch:
                await self._commit_alone(waiting)
            return
        for waiting, result in zip(batch, results, strict=True):
            _settle(waiting, result=result)

    async def _commit_alone(self, waiting: Waiting[Item, Result]) -> None:
        self.batch_sizes.append(1)
        try:
            async with self.db.transaction() as conn:
                [result] = await self._write(conn, [waiting.item])
        except Exception as exc:
            _settle(waiting, error=exc)
        else:
            _settle(waiting, result=result)


@dataclass
class WriteBatcher(GroupCommit[Unit[Any], Any]):
    """Runs the units handed to `run` in shared transactions; see the module's docstring."""

    max_units: int = MAX_BATCH_UNITS

    async def run(self, unit: Unit[T]) -> T:
        """The unit's result once its transaction committed; raises what running *this* unit raised."""
        result: T = await self.submit(unit)
        return result

    async def _write(self, conn: AsyncConnection, items: list[Unit[Any]]) -> list[Any]:
        return [await unit(conn) for unit in items]

    def _take(self, waiting: deque[Waiting[Unit[Any], Any]]) -> int:
        return min(self.max_units, len(waiting))


def _settle(waiting: Waiting[Any, Any], *, result: Any = None, error: BaseException | None = None) -> None:
    if waiting.answer.done():
        return
    if error is not None:
        waiting.answer.set_exception(error)
    else:
        waiting.answer.set_result(result)
