"""The leader's retention sweep (docs/design/cluster.md §3): ended runs, the access log, finished deliveries.

Knobs (read at every sweep, so a change applies at the next one): `run_retention_days` and
`audit_retention_days` (0 keeps forever), `webhook_dedup_ttl_ms` for finished deliveries,
`check_run_tracking_ttl_days` for sent status-report rows. Each
batch is its own short transaction, fenced with the lease epoch just before it commits, and the
sweep yields between batches, so a large backlog is worked off without blocking ingest and a node
that lost the lease deletes nothing more.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Protocol

from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.admin.store import delete_access_log_before
from conveyor.db.engine import Database
from conveyor.execution.retention import (
    RunCursor,
    delete_runs,
    delete_sent_status_reports,
    expired_runs,
    retention_cutoff,
)
from conveyor.ingest.store import prune_finished_deliveries
from conveyor.model.ids import utc_now
from conveyor.model.knobs import CLUSTER_KNOBS_BY_NAME
from conveyor.parts import PartKey

if TYPE_CHECKING:
    from conveyor.runtime.node import Component
    from conveyor.server.state import ServerState

log = logging.getLogger(__name__)

DEFAULT_BATCH = 500
# Runs finished per batch (their jobs, steps, needs, history, timeline and reports go with them).
DEFAULT_RUN_BATCH = 50


class Fence(Protocol):
    """`LeaderContext.fence`: raises `LeaseLost` unless this node still holds the lease's epoch."""

    async def __call__(self, conn: AsyncConnection) -> None: ...


@dataclass
class RetentionSettings:
    """The knobs the sweep reads, each an async getter of the effective value."""

    run_retention_days: Callable[[], Awaitable[int]]
    audit_retention_days: Callable[[], Awaitable[int]]
    webhook_dedup_ttl_ms: Callable[[], Awaitable[int]]
    # docs/design/execution.md §10.1 (0: kept until their run is deleted).
    check_run_tracking_ttl_days: Callable[[], Awaitable[int]] | None = None


@dataclass
class RetentionSweep:
    """Deletes what is past retention in bounded, fenced batches; counts per kind."""

    db: Database
    settings: RetentionSettings
    on_deleted: Callable[[str, int], None] = lambda kind, count: None
    clock: Callable[[], datetime] = utc_now
    batch: int = DEFAULT_BATCH
    run_batch: int = DEFAULT_RUN_BATCH
    # Transactions committed by the last sweep (tests read it to see that batches stay bounded).
    transactions: int = field(default=0, init=False)

    async def sweep(self, fence: Fence, now: datetime | None = None) -> dict[str, int]:
        """One full pass; returns the rows deleted per kind (also reported through `on_deleted`)."""
        now = now or self.clock()
        self.transactions = 0
        totals: dict[str, int] = {}
        run_cutoff = retention_cutoff(now, await self.settings.run_retention_days())
        if run_cutoff is not None:
            await self._runs(fence, run_cutoff, totals)
        audit_cutoff = retention_cutoff(now, await self.settings.audit_retention_days())
        if audit_cutoff is not None:
            await self._until_short(fence, "access_log", totals, audit_cutoff, delete_access_log_before)
        delivery_cutoff = now - timedelta(milliseconds=await self.settings.webhook_dedup_ttl_ms())
        await self._until_short(fence, "deliveries", totals, delivery_cutoff, prune_finished_deliveries)
        if self.settings.check_run_tracking_ttl_days is not None:
            report_cutoff = retention_cutoff(now, await self.settings.check_run_tracking_ttl_days())
            if report_cutoff is not None:
                await self._until_short(
                    fence, "status_reports", totals, report_cutoff, delete_sent_status_reports
                )
        return totals

    async def _runs(self, fence: Fence, cutoff: datetime, totals: dict[str, int]) -> None:
        cursor: RunCursor | None = None
        while True:
            async with self.db.read() as conn:
                batch = await expired_runs(conn, cutoff, self.run_batch, after=cursor)
            if not batch:
                return
            ids = [run.id for run in batch]
            finished = False
            while not finished:
                async with self.db.transaction() as conn:
                    counts, finished = await delete_runs(conn, ids, self.batch)
                    # Fence last: the lease row's share lock is then held only for the commit.
                    await fence(conn)
                self._count(counts, totals)
                await asyncio.sleep(0)  # let ingest and the API in between batches
            cursor = batch[-1]
            if len(batch) < self.run_batch:
                return

    async def _until_short(
        self,
        fence: Fence,
        kind: str,
        totals: dict[str, int],
        cutoff: datetime,
        delete: Callable[[AsyncConnection, datetime, int], Awaitable[int]],
    ) -> None:
        while True:
            async with self.db.transaction() as conn:
                deleted = await delete(conn, cutoff, self.batch)
                await fence(conn)
            self._count({kind: deleted}, totals)
            if deleted < self.batch:
                return
            await asyncio.sleep(0)

    def _count(self, counts: dict[str, int], totals: dict[str, int]) -> None:
        self.transactions += 1
        for kind, count in counts.items():
            if count:
                totals[kind] = totals.get(kind, 0) + count
                self.on_deleted(kind, count)


RETENTION = PartKey[RetentionSweep]("retention")


async def start(state: ServerState) -> Sequence[Component]:
    """Register the retention sweep as a leader task (coordinators only)."""
    from conveyor.runtime.boot import runtime_services
    from conveyor.runtime.lease import LeaderContext, LeaderTask

    if state.settings.cluster_role != "coordinator":
        return []
    runtime = runtime_services(state.parts)

    def knob(name: str) -> Callable[[], Awaitable[int]]:
        default = state.settings.knob_default(CLUSTER_KNOBS_BY_NAME[name])

        async def value() -> int:
            found = await runtime.settings.cluster_value(name)
            return int(found if found is not None else default or 0)

        return value

    sweeper = RetentionSweep(
        state.db,
        RetentionSettings(
            run_retention_days=knob("run_retention_days"),
            audit_retention_days=knob("audit_retention_days"),
            webhook_dedup_ttl_ms=knob("webhook_dedup_ttl_ms"),
            check_run_tracking_ttl_days=knob("check_run_tracking_ttl_days"),
        ),
        on_deleted=lambda kind, count: state.metrics.retention_deleted.labels(kind).inc(count),
    )
    state.parts.put(RETENTION, sweeper)

    async def run(context: LeaderContext) -> None:
        totals = await sweeper.sweep(context.fence)
        if totals:
            log.info("retention sweep deleted %s", totals)

    runtime.leadership.register(LeaderTask("retention", state.settings.retention_interval_ms, run))
    return []
