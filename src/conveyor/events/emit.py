"""Emit: insert an event in the caller's transaction (docs/design/events.md §2.2) with the circuit breaker of
docs/design/events.md §3.4."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.db.channels import EVENTS_CHANNEL
from conveyor.db.dialect import dialect_insert, notify
from conveyor.db.tables import events
from conveyor.events.models import (
    MAX_TARGET_REPOS,
    NAME_RE,
    EmitRejected,
    EmitRequest,
    EmitResult,
    EventSettings,
    is_reserved,
    metric_name,
    reserved_payload_problem,
)
from conveyor.model.ids import new_id, utc_now

log = logging.getLogger(__name__)

RATE_WINDOW = timedelta(seconds=60)

# In-process wake-up hints (SQLite has no NOTIFY): routers of this process register here.
_local_listeners: set[Callable[[str], None]] = set()


def add_local_listener(listener: Callable[[str], None]) -> None:
    """Be told the id of every event this process emits (a hint; the row is the truth)."""
    _local_listeners.add(listener)


def remove_local_listener(listener: Callable[[str], None]) -> None:
    """Stop being told."""
    _local_listeners.discard(listener)


# Metric sinks of the servers in this process: (event label, origin or reason, rejected?).
_metric_sinks: set[Callable[[str, str, bool], None]] = set()


def add_metric_sink(sink: Callable[[str, str, bool], None]) -> None:
    """Count emits and rejections of this process."""
    _metric_sinks.add(sink)


def remove_metric_sink(sink: Callable[[str, str, bool], None]) -> None:
    """Stop counting."""
    _metric_sinks.discard(sink)


def _count(name: str, label: str, rejected: bool) -> None:
    for sink in list(_metric_sinks):
        sink(metric_name(name), label, rejected)


def validate_request(request: EmitRequest, settings: EventSettings) -> None:
    """Name, payload type and size, target repos (raises `EmitRejected`)."""
    if request.origin in ("custom", "admin"):
        if is_reserved(request.name):
            raise EmitRejected("reserved_event_name", f"{request.name!r} is reserved for the orchestrator")
        if not NAME_RE.match(request.name):
            raise EmitRejected(
                "invalid_event_name", f"{request.name!r} does not match ^[a-z0-9][a-z0-9._-]{{0,127}}$"
            )
    if not isinstance(request.payload, dict):
        raise EmitRejected("invalid_payload", "the payload must be a JSON object")
    if request.origin == "system":
        problem = reserved_payload_problem(request.name, request.payload)
        if problem is not None:
            raise EmitRejected("invalid_payload", problem)
    try:
        size = len(json.dumps(request.payload, separators=(",", ":")).encode())
    except (TypeError, ValueError) as exc:
        raise EmitRejected("invalid_payload", f"the payload is not JSON: {exc}") from exc
    if size > settings.max_payload_bytes:
        raise EmitRejected(
            "payload_too_large",
            f"the payload is {size} bytes; the limit is {settings.max_payload_bytes}",
            status=413,
        )
    if request.target_repos is not None:
        if len(request.target_repos) > MAX_TARGET_REPOS or not all(
            isinstance(r, str) and r for r in request.target_repos
        ):
            raise EmitRejected(
                "invalid_payload", f"target_repos holds at most {MAX_TARGET_REPOS} repositories"
            )


def check_chain_depth(depth: int, settings: EventSettings) -> None:
    """Refuse depth ≥ the limit (stored depths are 0 … limit − 1)."""
    if depth >= settings.max_chain_depth:
        raise EmitRejected(
            "chain_depth_exceeded",
            f"chain depth {depth} reaches the limit of {settings.max_chain_depth}",
            status=400,
        )


def rate_limit_retry_after_ms(count: int, oldest: datetime | None, now: datetime, limit: int) -> int | None:
    """None while under the limit, else milliseconds until the oldest row leaves the window (pure)."""
    if count < limit:
        return None
    if oldest is None:
        return int(RATE_WINDOW.total_seconds() * 1000)
    return max(1, int((oldest + RATE_WINDOW - now).total_seconds() * 1000))


async def _existing(conn: AsyncConnection, dedup_key: str) -> str | None:
    found = await conn.execute(select(events.c.id).where(events.c.dedup_key == dedup_key))
    value = found.scalar_one_or_none()
    return None if value is None else str(value)


async def emit_in_tx(
    conn: AsyncConnection,
    request: EmitRequest,
    settings: EventSettings,
    *,
    now: datetime | None = None,
) -> EmitResult:
    """Insert the event in the caller's transaction; the hint is sent on commit (PostgreSQL)."""
    if request.dedup_key is not None:
        existing = await _existing(conn, request.dedup_key)
        if existing is not None:
            return EmitResult(existing, False)
    try:
        return await _emit_checked(conn, request, settings, now or utc_now())
    except EmitRejected as exc:
        reason = (
            exc.code
            if exc.code in ("chain_depth_exceeded", "rate_limited", "reserved_event_name")
            else "invalid"
        )
        _count(request.name, reason, True)
        raise


async def _emit_checked(
    conn: AsyncConnection, request: EmitRequest, settings: EventSettings, now: datetime
) -> EmitResult:
    validate_request(request, settings)
    check_chain_depth(request.chain_depth, settings)
    if not is_reserved(request.name):
        key = events.c.source_routing_key
        scope = key.is_(None) if request.source_routing_key is None else key == request.source_routing_key
        window = (
            await conn.execute(
                select(func.count(), func.min(events.c.created_at)).where(
                    scope, events.c.name == request.name, events.c.created_at > now - RATE_WINDOW
                )
            )
        ).one()
        retry_after = rate_limit_retry_after_ms(
            int(window[0]), window[1], now, settings.rate_limit_per_minute
        )
        if retry_after is not None:
            raise EmitRejected(
                "rate_limited",
                f"more than {settings.rate_limit_per_minute} {request.name!r} events in a minute",
                retry_after_ms=retry_after,
                status=429,
            )
    event_id = new_id()
    statement = (
        dialect_insert(conn, events)
        .values(
            id=event_id,
            name=request.name,
            origin=request.origin,
            org_id=request.org_id,
            payload=dict(request.payload),
            source_routing_key=request.source_routing_key,
            source_repo=request.source_repo,
            source_run_id=request.source_run_id,
            source_job_id=request.source_job_id,
            target_repos=list(request.target_repos) if request.target_repos else None,
            chain_depth=request.chain_depth,
            attempts=0,
            dedup_key=request.dedup_key,
            created_at=now,
        )
        .on_conflict_do_nothing(index_elements=["dedup_key"])
        .returning(events.c.id)
    )
    inserted = (await conn.execute(statement)).scalar_one_or_none()
    if inserted is None:
        assert request.dedup_key is not None
        existing = await _existing(conn, request.dedup_key)
        assert existing is not None
        return EmitResult(existing, False)
    await notify(conn, EVENTS_CHANNEL, event_id)
    _count(request.name, request.origin, False)
    if conn.dialect.name != "postgresql":
        for listener in list(_local_listeners):
            listener(event_id)
    return EmitResult(event_id, True)


async def emit_system(
    conn: AsyncConnection, request: EmitRequest, settings: EventSettings
) -> EmitResult | None:
    """A reserved event inside the transaction that causes it: a rejection is logged, never a rollback."""
    try:
        async with conn.begin_nested():
            return await emit_in_tx(conn, request, settings)
    except EmitRejected as exc:
        log.warning("system event %s not emitted: %s (%s)", request.name, exc.detail, exc.code)
        return None
