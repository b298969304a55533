"""The event router of one coordinator: hints, catch-up drain, workers, and the leader's scans
(docs/design/events.md §2.4)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.db.channels import EVENTS_CHANNEL
from conveyor.db.engine import Database
from conveyor.db.listen import NotificationListener
from conveyor.events import admin_store, batch, cron, store
from conveyor.events.emit import add_local_listener, remove_local_listener
from conveyor.events.metrics import EventMetrics
from conveyor.events.models import (
    NOTIFICATION,
    WORKFLOW_COMPLETE,
    EventSettings,
    LeaseLostError,
    NonRetryableEventError,
    is_reserved,
    metric_name,
    reserved_payload_problem,
)
from conveyor.events.notify_delivery import SecretLookup, deliver
from conveyor.events.registrations import IndexCache
from conveyor.events.router import EventView, RouteDecision, route, run_event
from conveyor.events.trust import Grant
from conveyor.execution import store as execution_store
from conveyor.execution.creation import RunOrigin, create_run
from conveyor.matching import event_summary
from conveyor.model.ids import utc_now
from conveyor.runtime.loops import WakeableLoop

log = logging.getLogger(__name__)

GAUGE_INTERVAL_S = 30.0


class EventService:
    """Routes events on this coordinator; its leader tasks run only where the lease is held."""

    def __init__(
        self,
        db: Database,
        settings: EventSettings,
        *,
        owner: Callable[[], str],
        metrics: EventMetrics,
        on_runs_created: Callable[[list[str]], Awaitable[None]] | None = None,
        clock: Callable[[], datetime] = utc_now,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self.db = db
        self.settings = settings
        self.owner = owner
        self.metrics = metrics
        self.on_runs_created = on_runs_created
        self.clock = clock
        self.rng = rng
        self.index = IndexCache()
        self._semaphore = asyncio.Semaphore(max(1, settings.concurrency))
        self._drain_loop = WakeableLoop("event-drain", self.drain, settings.poll_seconds, log)
        self._listener: NotificationListener | None = None
        self._failures_made: dict[str, int] = {}
        self._timers: set[asyncio.TimerHandle] = set()
        # Refreshes `settings` from the live cluster knobs (set by the start-up hook).
        self.settings_refresher: Callable[[], Awaitable[None]] | None = None
        # An org secret by name, for notification credentials (`secret:NAME`; set by the start-up hook).
        self.secret_lookup: SecretLookup | None = None
        self._gauges_at = 0.0

    # --- lifecycle

    async def start(self) -> None:
        """Drain the backlog, then listen for hints (NOTIFY on PostgreSQL, in-process on SQLite)."""
        await self._drain_loop.start()
        if self.db.dialect == "postgresql":
            self._listener = NotificationListener(
                self.db.url,
                {EVENTS_CHANNEL: lambda _event_id: self._drain_loop.wake()},
                name="event-listen",
                on_connect=self._drain_loop.wake,
                on_lost=lambda _exc: self.metrics.listen_reconnects.inc(),
            )
            await self._listener.start()
        else:
            add_local_listener(self._hint)

    async def stop(self) -> None:
        """Stop listening and draining."""
        remove_local_listener(self._hint)
        for timer in list(self._timers):
            timer.cancel()
        if self._listener is not None:
            await self._listener.stop()
        await self._drain_loop.stop()

    def _hint(self, _event_id: str) -> None:
        # Sent before the emitter commits: drain now and once more shortly after.
        self._drain_loop.wake()
        with contextlib.suppress(RuntimeError):
            loop = asyncio.get_running_loop()
            timer = loop.call_later(0.15, self._drain_loop.wake)
            self._timers.add(timer)
            loop.call_later(0.2, self._timers.discard, timer)

    def wake(self) -> None:
        """Drain soon (after an operator retry, for instance)."""
        self._drain_loop.wake()

    # --- drain and processing

    async def drain(self) -> int:
        """Page through unfinished, due, unleased rows in (created_at, id) order; lease and route each."""
        processed = 0
        after: tuple[datetime, str] | None = None
        if self.settings_refresher is not None:
            await self.settings_refresher()
        if time.monotonic() - self._gauges_at >= GAUGE_INTERVAL_S:
            self._gauges_at = time.monotonic()
            await self.refresh_gauges()
        try:
            while True:
                async with self.db.read() as conn:
                    page = await store.catchup_page(conn, self.clock(), after)
                if not page:
                    return processed
                # A TaskGroup, not gather: when the drain is cancelled (shutdown) gather returns at the
                # first cancelled child and leaves the rest closing their connections after the
                # engine is disposed, where they hang; the group waits for every child.
                async with asyncio.TaskGroup() as group:
                    tasks = [group.create_task(self._limited(event_id)) for _, event_id in page]
                processed += sum(1 for t in tasks if t.result() is not None)
                if len(page) < store.CATCHUP_PAGE:
                    return processed
                after = page[-1]
        except Exception:
            self.metrics.catchup_failures.inc()
            raise

    async def _limited(self, event_id: str) -> str | None:
        async with self._semaphore:
            try:
                return await self.process(event_id)
            except Exception:
                log.exception("processing event %s failed unexpectedly", event_id)
                return None

    async def process(self, event_id: str) -> str | None:
        """Lease one event and route it; returns the outcome, `retrying`/`dlq:…`, or None if not ours."""
        owner = self.owner()
        async with self.db.transaction() as conn:
            row = await store.take_lease(conn, event_id, owner, self.clock(), self.settings.lease_seconds)
        if row is None:
            return None
        attempt = int(row["attempts"])
        started = time.monotonic()
        label = metric_name(row["name"])
        try:
            self._test_failure(row)
            outcome, _count, created = await self._dispatch(row, owner, attempt)
        except LeaseLostError:
            self.metrics.lease_lost.inc()
            log.warning("event %s: lease lost before finish; the new holder processes it", event_id)
            return None
        except Exception as exc:
            return await self._failed(row, owner, attempt, exc)
        self.metrics.processed.labels(label, outcome).inc()
        self.metrics.attempts.labels(label, "processed").observe(attempt)
        self.metrics.processing_seconds.labels(label).observe(time.monotonic() - started)
        if is_reserved(row["name"]) and outcome not in ("matched", "buffered", "delivered"):
            self.metrics.unmatched.labels(row["name"], outcome).inc()
        if created and self.on_runs_created is not None:
            await self.on_runs_created(created)
        return outcome

    def _test_failure(self, row: dict[str, Any]) -> None:
        limit = self.settings.test_fail_first_n.get(row["name"])
        if limit is None:
            return
        made = self._failures_made.get(row["id"], 0)
        if made < limit:
            self._failures_made[row["id"]] = made + 1
            raise RuntimeError(f"test failure {made + 1} of {limit} (CONVEYOR_TEST_EVENT_FAIL_FIRST_N)")

    async def _failed(self, row: dict[str, Any], owner: str, attempt: int, exc: Exception) -> str | None:
        non_retryable = isinstance(exc, NonRetryableEventError)
        error = f"{type(exc).__name__}: {exc}"
        backoff = store.next_backoff(
            attempt, self.settings.retry_base_seconds, self.settings.retry_max_seconds, self.rng
        )
        async with self.db.transaction() as conn:
            result = await store.record_failure(
                conn,
                row["id"],
                owner,
                attempt,
                self.clock(),
                error,
                non_retryable=non_retryable,
                max_attempts=self.settings.max_attempts,
                backoff_s=backoff,
            )
        label = metric_name(row["name"])
        if result is None:
            self.metrics.lease_lost.inc()
        elif result.startswith("dlq:"):
            self.metrics.dlq.labels(label, result.removeprefix("dlq:")).inc()
            self.metrics.attempts.labels(label, "dlq").observe(attempt)
            log.warning("event %s (%s) moved to the DLQ: %s", row["id"], row["name"], error)
        else:
            self.metrics.retries.labels(label).inc()
            log.info("event %s (%s) attempt %d failed: %s", row["id"], row["name"], attempt, error)
        return result

    async def _dispatch(self, row: dict[str, Any], owner: str, attempt: int) -> tuple[str, int, list[str]]:
        if row["name"] == NOTIFICATION:
            return await self._notify(row, owner, attempt)
        view = EventView.from_row(row)
        created: list[str] = []
        async with self.db.transaction() as conn:
            index = await self.index.get(conn)
            grants = await self._grants(conn, view.org_id)
            lifecycle = await self._source_run_lifecycle(conn, view)
            decision = route(view, index, grants, source_run_by_failure_lifecycle=lifecycle)
            created = await self._apply(conn, view, decision)
            if view.name in self.settings.test_stall_names:
                log.warning("event %s: stalling before finish (CONVEYOR_TEST_EVENT_STALL)", view.id)
                await asyncio.Event().wait()
            count = len(decision.dispatch)
            if not await store.finish(conn, view.id, owner, attempt, self.clock(), decision.outcome, count):
                raise LeaseLostError(view.id)
        return decision.outcome, count, created

    async def _notify(self, row: dict[str, Any], owner: str, attempt: int) -> tuple[str, int, list[str]]:
        """Deliver a notification (docs/design/events.md §10) outside any transaction, then finish the
        event; a failure raises into the retry/DLQ path like a failed dispatch."""
        payload = row["payload"] or {}
        problem = reserved_payload_problem(NOTIFICATION, payload)
        if problem is not None:
            raise NonRetryableEventError(problem)
        outcome = await deliver(self.db, payload, self.settings, self.secret_lookup)
        count = 1 if outcome == "delivered" else 0
        async with self.db.transaction() as conn:
            if not await store.finish(conn, row["id"], owner, attempt, self.clock(), outcome, count):
                raise LeaseLostError(row["id"])
        return outcome, count, []

    async def _grants(self, conn: AsyncConnection, org_id: str | None) -> list[Grant]:
        if org_id is None:
            return []
        return await admin_store.enabled_grants(conn, org_id)

    async def _source_run_lifecycle(self, conn: AsyncConnection, view: EventView) -> bool:
        if view.name != WORKFLOW_COMPLETE or view.payload.get("status") != "failed":
            return False
        run_id = view.payload.get("run_id")
        return isinstance(run_id, str) and await execution_store.dispatched_by_failure_lifecycle(conn, run_id)

    async def _apply(self, conn: AsyncConnection, view: EventView, decision: RouteDecision) -> list[str]:
        """Create the runs and fill the batch windows, in the finish transaction."""
        assert decision.event is not None
        created: list[str] = []
        now = self.clock()
        for item in decision.dispatch:
            registration = item.registration
            source = await admin_store.source_of_routing_key(conn, registration.routing_key)
            if source is None:
                raise NonRetryableEventError(
                    f"registration {registration.id} names routing key {registration.routing_key}, "
                    "which no source has any more"
                )
            event = run_event(decision.event, registration)
            run = await create_run(
                conn,
                origin=RunOrigin(
                    org_id=registration.org_id,
                    source_id=source.id,
                    routing_key=registration.routing_key,
                    event_id=view.id,
                    registration_id=registration.id,
                    chain_depth=view.chain_depth,
                ),
                workflow=registration.entry,
                event=event,
                trigger_trace={"event": event_summary(event), "workflow": item.decision.as_dict()},
            )
            if run is None:
                continue
            if item.failure_lifecycle:
                await execution_store.mark_dispatched_by_failure_lifecycle(conn, run.id)
            created.append(run.id)
        for buffered in decision.buffer:
            payload = view.payload
            await batch.append(
                conn,
                registration_id=buffered.registration.id,
                org_id=buffered.registration.org_id,
                routing_key=buffered.registration.routing_key,
                repo=buffered.registration.repo,
                window_ms=buffered.window_ms,
                item=batch.BatchItem(
                    run_id=str(payload.get("run_id")),
                    repo=str(payload.get("repo", "")),
                    workflow_name=str(payload.get("workflow_name", "")),
                    failure_class=payload.get("failure_class"),
                    sender=payload.get("sender"),
                    chain_depth=max(0, view.chain_depth - 1),
                ),
                now=now,
            )
        return created

    # --- leader tasks

    async def scan(self, fence: Callable[[AsyncConnection], Awaitable[None]]) -> None:
        """Release expired leases, close due batch windows, refresh gauges."""
        now = self.clock()
        async with self.db.transaction() as conn:
            released = await store.release_expired(conn, now, self.settings.max_attempts)
            closed = await batch.close_due(conn, now, self.settings)
            await fence(conn)
        expired = released["released"] + released["dlq"]
        if expired:
            self.metrics.lease_expirations.inc(expired)
        if closed:
            self.metrics.batches_emitted.inc(closed)
        if released["released"] or closed:
            self.wake()
        await self.refresh_gauges()

    async def refresh_gauges(self) -> None:
        """Backlog, DLQ depth, open windows."""
        async with self.db.read() as conn:
            backlog, depth = await store.backlog_counts(conn)
            windows = await batch.open_windows(conn)
        self.metrics.backlog.set(backlog)
        self.metrics.dlq_depth.set(depth)
        self.metrics.windows_open.set(int(windows))

    async def cleanup(
        self, fence: Callable[[AsyncConnection], Awaitable[None]], ttl_s: int | None = None
    ) -> int:
        """TTL cleanup in batches of 1000; never DLQ or unfinished rows."""
        total = 0
        while True:
            async with self.db.transaction() as conn:
                deleted = await store.cleanup(
                    conn, self.clock(), self.settings.ttl_seconds if ttl_s is None else ttl_s
                )
                await fence(conn)
            total += deleted
            if deleted < 1000:
                async with self.db.transaction() as conn:
                    await cron.prune_fires(conn, self.clock())
                    await fence(conn)
                return total

    async def cron_tick(self, fence: Callable[[AsyncConnection], Awaitable[None]]) -> int:
        """Fire due schedules."""
        fired = await cron.tick(self.db, self.settings, self.metrics, fence, self.clock())
        if fired:
            self.wake()
        return fired
