"""Spawn windows, Layer A, and re-dispatch (docs/design/cluster.md §4.3, §4.4): the timer mirroring a
rerouted job's `reroute_window_expires_at`, the leader's sweep of windows whose coordinator is gone, and
taking a job that never started back from its worker.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from datetime import datetime, timedelta

from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.cluster import store
from conveyor.cluster.messages import JobCancelRequest
from conveyor.cluster.reroute.core import RerouteCore
from conveyor.cluster.reroute.policy import worker_agent_id
from conveyor.execution.lifecycle import lock_job_for_change
from conveyor.execution.queue import Claim
from conveyor.runtime import store as instance_store

log = logging.getLogger(__name__)

# A spawn-window check that could not read or write the row looks again after this long.
WINDOW_RETRY_S = 1.0
# PostgreSQL's `lock_not_available`: a `lock_timeout` ran out.
LOCK_NOT_AVAILABLE = "55P03"


class WindowPart(RerouteCore):
    """The reroute service's spawn windows and re-dispatch."""

    def arm_window(self, job_id: str, worker: str, delay_s: float) -> None:
        """(Re-)arm the in-memory timer mirroring the job's `reroute_window_expires_at`."""
        self.disarm_window(job_id)
        self.windows[job_id] = asyncio.create_task(
            self._window_timer(job_id, worker, max(0.0, delay_s)), name=f"reroute-window-{job_id}"
        )

    def disarm_window(self, job_id: str) -> None:
        """The job started, ended or was taken back: its timer stops (never the running timer itself)."""
        timer = self.windows.pop(job_id, None)
        if timer is not None and timer is not asyncio.current_task():
            timer.cancel()

    async def _window_timer(self, job_id: str, worker: str, delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        if self.windows.get(job_id) is asyncio.current_task():
            del self.windows[job_id]
        try:
            await self.window_lapsed(job_id, worker)
        except Exception:
            # The row decides, and it could not be read or written: look again shortly.
            log.exception("checking the spawn window of job %s failed; retrying", job_id)
            self.arm_window(job_id, worker, WINDOW_RETRY_S)

    async def window_lapsed(self, job_id: str, worker: str) -> bool:
        """Layer A on expiry: read the row; started, ended or held elsewhere → nothing; a window
        re-armed to a later deadline → wait for it; still not started → re-dispatch
        (docs/design/cluster.md §4.4)."""
        async with self.db.read() as conn:
            now = await store.database_now(conn)
            holder = await store.reroute_holder(conn, job_id)
        if holder is None or holder.rerouted_to != worker or holder.window_expires_at is None:
            return False
        if holder.window_expires_at > now:
            self.arm_window(job_id, worker, (holder.window_expires_at - now).total_seconds())
            return False
        # The take-back locks the job's rows to check, under the locks, that this coordinator's worker still
        # holds the job unstarted. That wait is bounded by `ownership_db_check_timeout_ms`: past it the check
        # defers (nothing is done, the timer looks again) instead of stalling the timer behind a long
        # transaction; the conditional update under the locks keeps a later attempt from acting twice.
        wait_ms = await self.ownership_check_timeout_ms()
        try:
            return await self.redispatch(
                job_id, worker, "window", "spawn window lapsed", lapsed_by=now, lock_wait_ms=wait_ms
            )
        except DBAPIError as exc:
            if getattr(exc.orig, "sqlstate", None) != LOCK_NOT_AVAILABLE:
                raise
        self.metrics.ownership_deferrals.inc()
        log.info(
            "the ownership check of job %s waited past ownership_db_check_timeout_ms (%d ms); deferred",
            job_id,
            wait_ms,
        )
        self.arm_window(job_id, worker, WINDOW_RETRY_S)
        return False

    async def rearm_windows(self) -> int:
        """At start: a timer for each armed window of the jobs this coordinator's claims hold (a
        restart loses the in-memory ones; the rows keep the deadlines)."""
        async with self.db.read() as conn:
            now = await store.database_now(conn)
            armed = await store.armed_windows(conn, owner=self.owner())
        for window in armed:
            self.arm_window(window.job_id, window.worker, (window.expires_at - now).total_seconds())
        return len(armed)

    async def sweep_lapsed_windows(
        self,
        instance_window: timedelta,
        transaction: Callable[[], AbstractAsyncContextManager[AsyncConnection]] | None = None,
    ) -> int:
        """The leader's sweep: Layer A for lapsed windows whose owning coordinator is not live in
        `cluster_instances` (a live owner's own timer decides); how many jobs it took back. Each
        take-back runs in `transaction` (the leader's fenced one)."""
        async with self.db.read() as conn:
            now = await store.database_now(conn)
            lapsed = await store.armed_windows(conn, lapsed_by=now)
            if not lapsed:
                return 0
            live = {
                row.instance_id
                for row in await instance_store.list_instances(conn)
                if now - row.last_heartbeat_at <= instance_window
            }
        taken = 0
        for window in lapsed:
            if window.owner in live:
                continue
            detail = f"spawn window lapsed and its coordinator {window.owner or 'unknown'} is not live"
            if await self.redispatch(
                window.job_id, window.worker, "window", detail, lapsed_by=now, transaction=transaction
            ):
                taken += 1
        return taken

    # --- re-dispatch (docs/design/cluster.md §4.4)

    async def redispatch(
        self,
        job_id: str,
        worker: str,
        reason: str,
        detail: str,
        *,
        lapsed_by: datetime | None = None,
        transaction: Callable[[], AbstractAsyncContextManager[AsyncConnection]] | None = None,
        lock_wait_ms: int | None = None,
    ) -> bool:
        """Take a not-yet-started job back from `worker` and send it onwards; whether this call won.

        One conditional update decides among Layer A (the window timer), Layer B (a relayed spawn
        failure) and the leader's sweep. The winner cancels the job on the old worker (best effort),
        appends it to `tried` and offers the same job to the next candidate with `hop + 1`, or hands
        the row back to local capacity. `reason` is the metric's (`window`, `final`, `cap`). The
        leader's sweep passes its fenced `transaction`, so a deposed leader takes nothing back; the owner's
        window timer passes `lock_wait_ms`, the bound of its wait for the job's row locks (PostgreSQL).
        """
        async with (transaction or self.db.transaction)() as conn:
            if lock_wait_ms is not None:
                await instance_store.limit_lock_wait(conn, lock_wait_ms)
            await lock_job_for_change(conn, job_id)
            taken = await store.take_back(conn, job_id, worker, lapsed_by=lapsed_by)
        if taken is None:
            return False
        self.disarm_window(job_id)
        self.metrics.redispatches.labels(reason).inc()
        log.warning(
            "took job %s back from worker %s (%s): %s",
            job_id,
            worker,
            reason,
            detail,
            extra={"job_id": job_id, "run_id": taken.run_id},
        )
        await self._send(
            worker, JobCancelRequest(run_id=taken.run_id, job_id=job_id, reason="rerouted", force=True)
        )
        self.job_secrets.pop(job_id, None)
        from_agent = taken.claim_agent or worker_agent_id(worker)
        tried = [*(taken.tried or [self.owner()]), worker]
        outcome, why = "taken_back", f"worker {worker}: {detail}"
        try:
            dispatch = await self.dispatcher.build_dispatch(Claim(job_id, taken.run_id, taken.attempt))
        except Exception:
            log.exception("rebuilding the dispatch of job %s failed; it goes back to the queue", job_id)
            await self._hand_back(
                job_id,
                taken.run_id,
                taken.attempt,
                from_agent=from_agent,
                tried=tried,
                hop=taken.hop,
                outcome=outcome,
                reason=reason,
                detail=why,
            )
            return True
        if dispatch is None:
            return True  # it may not run any more: the build failed it
        await self._route_onwards(
            dispatch,
            from_agent=from_agent,
            tried=tried,
            hop=taken.hop + 1,
            settings=await self.settings(taken.org_id),
            org_id=taken.org_id,
            outcome=outcome,
            reason=reason,
            detail=why,
        )
        return True
