"""The leader lease and the leader-only task framework (docs/design/cluster.md §3).

One `leader_lease` row elects the node that runs cluster-singleton work. Its epoch is a fencing
token: every leader-only transaction starts with `fence(conn)`, which holds a share lock on the
lease row of our epoch, so a leader that was paused past its TTL (GC, SIGSTOP, a slow disk) and
resumes after a successor took over cannot commit anything.

Later packages register their work as `LeaderTask`s on the running `Leadership`
(`runtime_services(state.parts).leadership.register(...)`); a task runs only while this node
holds the lease and is cancelled within one renew period of losing it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.aio import wait_event
from conveyor.db.engine import Database
from conveyor.errors import ConveyorError
from conveyor.runtime import store

log = logging.getLogger(__name__)

# The most a renewal may run before the lease is given up (docs/design/cluster.md: "TTL − 1 s"), shortened
# for the sub-second TTLs of tests so that it never eats the whole TTL.
MAX_RENEWAL_MARGIN_MS = 1000


class LeaseLost(ConveyorError):
    """The lease of this epoch is no longer ours; leader-only work must stop and nothing may commit."""


def renewal_budget_ms(ttl_ms: int) -> int:
    """How long after the last successful renewal *began* this node may still act as leader."""
    return ttl_ms - min(MAX_RENEWAL_MARGIN_MS, ttl_ms // 3)


def renewal_overdue(last_renewal_began: float, now: float, ttl_ms: int) -> bool:
    """True once more than the renewal budget has passed (monotonic seconds) without a renewal."""
    return (now - last_renewal_began) * 1000 > renewal_budget_ms(ttl_ms)


@dataclass(frozen=True)
class LeaderContext:
    """What a leader task gets for one leadership term: the epoch and a fence bound to it."""

    db: Database
    holder: str
    epoch: int
    ttl_ms: int
    on_lost: Callable[[], None]

    async def fence(self, conn: AsyncConnection) -> None:
        """Fence a leader-only transaction: raise `LeaseLost` unless our epoch still holds.

        The share lock it takes lasts until commit, and it also delays this node's own renewal (an
        UPDATE of the same row), so keep fenced transactions short; fencing as the last statement
        before commit is just as safe and holds the lock only for the commit.
        """
        # A leader frozen inside this transaction would keep its share lock and block every
        # successor; PostgreSQL ends such a session after one TTL.
        await store.limit_idle_in_transaction(conn, self.ttl_ms)
        if not await store.fence_lease(conn, self.holder, self.epoch):
            self.on_lost()
            raise LeaseLost(f"the leader lease of epoch {self.epoch} is no longer held by {self.holder}")

    @asynccontextmanager
    async def fenced_transaction(self) -> AsyncIterator[AsyncConnection]:
        """A write transaction that begins with `fence`; rolled back if the fence fails."""
        async with self.db.transaction() as conn:
            await self.fence(conn)
            yield conn


@dataclass(frozen=True)
class LeaderTask:
    """A cluster-singleton job: `run(context)` every `interval_ms` while this node leads."""

    name: str
    interval_ms: int
    run: Callable[[LeaderContext], Awaitable[None]]


class Leadership:
    """Acquires and renews the lease, and runs the registered leader tasks while it holds it."""

    def __init__(
        self,
        db: Database,
        *,
        holder: str,
        ttl_ms: int,
        renew_ms: int,
        on_change: Callable[[bool, int | None], None] = lambda leading, epoch: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.db = db
        self.holder = holder
        self.ttl_ms = ttl_ms
        self.renew_ms = renew_ms
        self.on_change = on_change
        self.clock = clock
        self.epoch: int | None = None
        self.tasks: list[LeaderTask] = []
        self._last_renewal_began = 0.0
        self._running: dict[str, asyncio.Task[None]] = {}
        self._lost = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None

    @property
    def is_leader(self) -> bool:
        """Whether this node currently acts as leader."""
        return self.epoch is not None

    @property
    def _ttl(self) -> timedelta:
        return timedelta(milliseconds=self.ttl_ms)

    def register(self, task: LeaderTask) -> None:
        """Add a leader-only task; it starts at once if this node already leads."""
        if any(existing.name == task.name for existing in self.tasks):
            raise ValueError(f"a leader task named {task.name!r} is already registered")
        self.tasks.append(task)
        if self.epoch is not None:
            self._start_task(task, self._context(self.epoch))

    def context(self) -> LeaderContext | None:
        """The current term's context (None while not leading), for fencing ad-hoc leader writes."""
        return None if self.epoch is None else self._context(self.epoch)

    async def fence(self, conn: AsyncConnection) -> None:
        """Fence a transaction with the current epoch; `LeaseLost` when not leading."""
        context = self.context()
        if context is None:
            raise LeaseLost(f"{self.holder} does not hold the leader lease")
        await context.fence(conn)

    # --- one step of the loop (tests drive these directly)

    async def try_acquire(self) -> bool:
        """One acquisition attempt; on success the leader tasks start."""
        began = self.clock()
        try:
            async with self.db.transaction() as conn:
                # A fenced leader transaction holds the row; do not queue behind it for longer
                # than one renew period, the next attempt comes anyway.
                await store.limit_lock_wait(conn, self.renew_ms)
                await store.limit_idle_in_transaction(conn, self.ttl_ms)
                epoch = await store.acquire_lease(conn, self.holder, self._ttl)
        except Exception as exc:
            log.warning("leader lease acquisition failed: %s", exc)
            return False
        if epoch is None:
            return False
        self._last_renewal_began = began
        self._lost.clear()
        self.epoch = epoch
        log.info("leader lease acquired", extra={"epoch": epoch})
        self.on_change(True, epoch)
        context = self._context(epoch)
        for task in self.tasks:
            self._start_task(task, context)
        return True

    async def renew(self) -> bool:
        """One renewal; steps down when it fails, finds the lease gone, or comes too late."""
        epoch = self.epoch
        if epoch is None:
            return False
        if self._lost.is_set():
            await self.step_down("a fenced write found the lease gone")
            return False
        began = self.clock()
        if renewal_overdue(self._last_renewal_began, began, self.ttl_ms):
            await self.step_down("the lease was not renewed in time")
            return False
        budget_s = renewal_budget_ms(self.ttl_ms) / 1000 - (began - self._last_renewal_began)
        try:
            async with asyncio.timeout(budget_s):
                async with self.db.transaction() as conn:
                    # Paused between UPDATE and COMMIT, this node would hold the lease row's lock
                    # and keep every successor out; PostgreSQL ends such a session after one TTL.
                    await store.limit_idle_in_transaction(conn, self.ttl_ms)
                    renewed = await store.renew_lease(conn, self.holder, epoch, self._ttl)
        except Exception as exc:
            log.warning("leader lease renewal failed: %s", exc)
            renewed = False
        if not renewed:
            await self.step_down("the lease could not be renewed")
            return False
        self._last_renewal_began = began
        return True

    async def step_down(self, reason: str, *, wait_for_tasks: bool = False) -> None:
        """Stop every leader task at once and go back to acquiring.

        A lost lease waits only a renew period for the tasks, which are fenced anyway; a shutdown
        (`wait_for_tasks`) waits until they have finished, so none touches a disposed database.
        """
        if self.epoch is None:
            return
        log.warning("stepping down as leader: %s", reason, extra={"epoch": self.epoch})
        self.epoch = None
        self._lost.clear()
        self.on_change(False, None)
        running = list(self._running.values())
        self._running.clear()
        for task in running:
            task.cancel()
        if running:
            await asyncio.wait(running, timeout=None if wait_for_tasks else self.renew_ms / 1000)

    # --- component

    async def start(self) -> None:
        """Try once now (unless already leading), then acquire or renew every renew period."""
        if self.epoch is None:
            await self.try_acquire()
        self._loop_task = asyncio.create_task(self._loop(), name="leader-lease")

    async def acquire_within(self, timeout_ms: int, poll_ms: int = 100) -> bool:
        """Keep trying to acquire for up to `timeout_ms` (SQLite boot: one TTL); True once leading."""
        deadline = self.clock() + timeout_ms / 1000
        while not await self.try_acquire():
            if self.clock() >= deadline:
                return False
            await asyncio.sleep(poll_ms / 1000)
        return True

    async def _loop(self) -> None:
        while True:
            # Wake early when a fenced write finds the lease gone, so the tasks stop at once.
            await wait_event(self._lost, self.renew_ms / 1000)
            try:
                if self.epoch is None:
                    await self.try_acquire()
                else:
                    await self.renew()
            except Exception:  # the loop must survive anything a single step does
                log.exception("leader lease step failed")

    async def stop(self) -> None:
        """Stop the loop and the tasks, and expire our lease so a successor takes over at once."""
        if self._loop_task is not None:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)
        epoch = self.epoch
        await self.step_down("shutting down", wait_for_tasks=True)
        if epoch is not None:
            try:
                async with self.db.transaction() as conn:
                    await store.release_lease(conn, self.holder, epoch)
            except Exception as exc:
                log.warning("could not release the leader lease: %s", exc)

    # --- internals

    def _context(self, epoch: int) -> LeaderContext:
        return LeaderContext(
            db=self.db,
            holder=self.holder,
            epoch=epoch,
            ttl_ms=self.ttl_ms,
            on_lost=lambda: self._mark_lost(epoch),
        )

    def _mark_lost(self, epoch: int) -> None:
        # A context of an earlier term must not end the current one.
        if self.epoch == epoch:
            self._lost.set()

    def _start_task(self, task: LeaderTask, context: LeaderContext) -> None:
        self._running[task.name] = asyncio.create_task(
            self._run_task(task, context), name=f"leader-task:{task.name}"
        )

    async def _run_task(self, task: LeaderTask, context: LeaderContext) -> None:
        while True:
            try:
                await task.run(context)
            except LeaseLost as exc:
                log.warning("leader task %s stopped: %s", task.name, exc)
                self._mark_lost(context.epoch)
                return
            except Exception:
                log.exception("leader task %s failed; it runs again next interval", task.name)
            await asyncio.sleep(task.interval_ms / 1000)
