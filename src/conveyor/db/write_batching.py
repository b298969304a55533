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

log = logging.getLogger("conveyor.db.write_batching")

T = TypeVar("T")
Unit = Callable[[AsyncConnection], Awaitable[T]]

MAX_BATCH_UNITS = 64


@dataclass
class _Waiting(Generic[T]):
    unit: Unit[T]
    answer: asyncio.Future[T]


@dataclass
class WriteBatcher:
    """Runs the units handed to `run` in shared transactions; see the module's docstring."""

    db: Database
    max_units: int = MAX_BATCH_UNITS
    # How many units each transaction carried (bounded, newest last): what tests and diagnostics see.
    batch_sizes: deque[int] = field(default_factory=lambda: deque(maxlen=1000), init=False)
    _queue: deque[_Waiting[Any]] = field(default_factory=deque, init=False)
    _task: asyncio.Task[None] | None = field(default=None, init=False)

    async def run(self, unit: Unit[T]) -> T:
        """The unit's result once its transaction committed; raises what running *this* unit raised."""
        answer: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._queue.append(_Waiting(unit, answer))
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run_all(), name="write-batcher")
        # Shielded: a caller that goes away must not cancel a transaction other callers share.
        return await asyncio.shield(answer)

    async def _run_all(self) -> None:
        while self._queue:
            batch = [self._queue.popleft() for _ in range(min(self.max_units, len(self._queue)))]
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

    async def _commit(self, batch: list[_Waiting[Any]]) -> None:
        try:
            async with self.db.transaction() as conn:
                results = [await waiting.unit(conn) for waiting in batch]
        except Exception as exc:
            if len(batch) == 1:
                _settle(batch[0], error=exc)
                return
            log.debug("a batch of %d writes failed (%r); running each on its own", len(batch), exc)
            for waiting in batch:
                await self._commit_alone(waiting)
            return
        for waiting, result in zip(batch, results, strict=True):
            _settle(waiting, result=result)

    async def _commit_alone(self, waiting: _Waiting[Any]) -> None:
        self.batch_sizes.append(1)
        try:
            async with self.db.transaction() as conn:
                result = await waiting.unit(conn)
        except Exception as exc:
            _settle(waiting, error=exc)
        else:
            _settle(waiting, result=result)


def _settle(waiting: _Waiting[Any], *, result: Any = None, error: BaseException | None = None) -> None:
    if waiting.answer.done():
        return
    if error is not None:
        waiting.answer.set_exception(error)
    else:
        waiting.answer.set_result(result)
