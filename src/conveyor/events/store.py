"""All SQL of the event store (docs/design/events.md §2.3, §2.4, §7): lease, finish, retry, DLQ, cleanup,
listing."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, delete, func, or_, select, tuple_, update
from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.admin.pagination import keyset_page, next_cursor
from conveyor.db.tables import events, runs
from conveyor.events.models import truncate_error
from conveyor.events.state import processing_state, state_expression

CATCHUP_PAGE = 100

LIST_COLUMNS = (
    "id",
    "name",
    "origin",
    "match_outcome",
    "matched_count",
    "attempts",
    "chain_depth",
    "source_routing_key",
    "source_repo",
    "source_run_id",
    "target_repos",
    "created_at",
    "processed_at",
    "next_retry_at",
    "dlq_at",
    "dlq_reason",
    "last_error",
)


def next_backoff(
    attempts: int, base_s: float, cap_s: float, rng: Callable[[], float] = random.random
) -> float:
    """Seconds until the next attempt: uniform(0, min(cap, base · 2^(attempts − 1))) (full jitter)."""
    ceiling = min(cap_s, base_s * 2 ** max(0, attempts - 1))
    return rng() * ceiling


def _unfinished() -> Any:
    return and_(events.c.processed_at.is_(None), events.c.dlq_at.is_(None))


async def take_lease(
    conn: AsyncConnection, event_id: str, owner: str, now: datetime, lease_s: float
) -> dict[str, Any] | None:
    """The only way to start processing: one conditional UPDATE; None when taken, finished or not due."""
    c = events.c
    result = await conn.execute(
        update(events)
        .where(
            c.id == event_id,
            _unfinished(),
            or_(c.lease_expires_at.is_(None), c.lease_expires_at <= now),
            or_(c.next_retry_at.is_(None), c.next_retry_at <= now),
        )
        .values(lease_owner=owner, lease_expires_at=now + timedelta(seconds=lease_s), attempts=c.attempts + 1)
        .returning(*events.c)
    )
    row = result.first()
    return dict(row._mapping) if row is not None else None


async def finish(
    conn: AsyncConnection, event_id: str, owner: str, attempt: int, now: datetime, outcome: str, count: int
) -> bool:
    """Mark processed, fenced by (lease_owner, attempts); False = the lease was lost (roll back)."""
    c = events.c
    result = await conn.execute(
        update(events)
        .where(c.id == event_id, c.lease_owner == owner, c.attempts == attempt, _unfinished())
        .values(
            processed_at=now,
            match_outcome=outcome,
            matched_count=count,
            lease_owner=None,
            lease_expires_at=None,
            next_retry_at=None,
        )
    )
    return result.rowcount == 1


async def record_failure(
    conn: AsyncConnection,
    event_id: str,
    owner: str,
    attempt: int,
    now: datetime,
    error: str,
    *,
    non_retryable: bool,
    max_attempts: int,
    backoff_s: float,
) -> str | None:
    """One fenced UPDATE after a failed attempt: `dlq` (with reason) or `retrying`; None if the lease was lost."""
    c = events.c
    values: dict[str, Any] = {
        "lease_owner": None,
        "lease_expires_at": None,
        "last_error": truncate_error(error),
    }
    if non_retryable:
        values.update(dlq_at=now, dlq_reason="non_retryable", next_retry_at=None)
        result_state = "dlq:non_retryable"
    elif attempt >= max_attempts:
        values.update(dlq_at=now, dlq_reason="exhausted_retries", next_retry_at=None)
        result_state = "dlq:exhausted_retries"
    else:
        values.update(next_retry_at=now + timedelta(seconds=backoff_s))
        result_state = "retrying"
    result = await conn.execute(
        update(events)
        .where(c.id == event_id, c.lease_owner == owner, c.attempts == attempt, _unfinished())
        .values(**values)
    )
    return result_state if result.rowcount == 1 else None


async def catchup_page(
    conn: AsyncConnection, now: datetime, after: tuple[datetime, str] | None, limit: int = CATCHUP_PAGE
) -> list[tuple[datetime, str]]:
    """Unfinished, due, unleased rows in (created_at, id) order strictly after the cursor."""
    c = events.c
    query = select(c.created_at, c.id).where(
        _unfinished(),
        c.lease_owner.is_(None),
        or_(c.next_retry_at.is_(None), c.next_retry_at <= now),
    )
    if after is not None:
        query = query.where(tuple_(c.created_at, c.id) > tuple_(*after))
    rows = await conn.execute(query.order_by(c.created_at, c.id).limit(limit))
    return [(r.created_at, r.id) for r in rows]


async def release_expired(
    conn: AsyncConnection, now: datetime, max_attempts: int, limit: int = 200
) -> dict[str, int]:
    """Leader scan: expired leases go back (hinted) or to the DLQ when out of attempts."""
    c = events.c
    rows = (
        await conn.execute(
            select(c.id, c.lease_owner, c.attempts)
            .where(_unfinished(), c.lease_owner.is_not(None), c.lease_expires_at <= now)
            .limit(limit)
        )
    ).all()
    released = dlq = 0
    for row in rows:
        guard = and_(
            c.id == row.id, c.lease_owner == row.lease_owner, c.attempts == row.attempts, _unfinished()
        )
        message = f"lease expired (owner {row.lease_owner})"
        if row.attempts >= max_attempts:
            values: dict[str, Any] = {"dlq_at": now, "dlq_reason": "exhausted_retries", "next_retry_at": None}
        else:
            values = {"next_retry_at": now}
        result = await conn.execute(
            update(events)
            .where(guard)
            .values(lease_owner=None, lease_expires_at=None, last_error=message, **values)
        )
        if result.rowcount == 1:
            if "dlq_at" in values:
                dlq += 1
            else:
                released += 1
    return {"released": released, "dlq": dlq}


async def cleanup(conn: AsyncConnection, now: datetime, ttl_s: int, batch: int = 1000) -> int:
    """Delete processed rows older than the TTL; DLQ and unfinished rows are never deleted."""
    c = events.c
    ids = [
        r
        for r in (
            await conn.execute(
                select(c.id)
                .where(
                    c.processed_at.is_not(None),
                    c.processed_at < now - timedelta(seconds=ttl_s),
                    c.dlq_at.is_(None),
                )
                .limit(batch)
            )
        ).scalars()
    ]
    if not ids:
        return 0
    result = await conn.execute(delete(events).where(c.id.in_(ids), c.dlq_at.is_(None)))
    return int(result.rowcount)


async def get_event(conn: AsyncConnection, event_id: str) -> dict[str, Any] | None:
    """The full row."""
    row = (await conn.execute(select(events).where(events.c.id == event_id))).first()
    return dict(row._mapping) if row is not None else None


def list_item(row: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    """An event as the admin API lists it: metadata and state, no payload."""
    item = {key: row[key] for key in LIST_COLUMNS}
    item["state"] = processing_state(row, now)
    return item


async def page_events(
    conn: AsyncConnection,
    *,
    filters: Mapping[str, Any],
    limit: int,
    cursor: str | None,
    now: datetime,
) -> tuple[list[dict[str, Any]], str | None]:
    """Events newest first by (created_at, id), filtered; keyset cursor bound to the filters."""
    c = events.c
    query = select(events)
    if filters.get("name") is not None:
        query = query.where(c.name == filters["name"])
    if filters.get("internal") is False:
        # Conveyor's own names (`__workflow_complete`, `conveyor.notification`): the dashboard hides them.
        query = query.where(
            ~or_(c.name.startswith("__", autoescape=True), c.name.startswith("conveyor.", autoescape=True))
        )
    if filters.get("outcome") is not None:
        query = query.where(c.match_outcome == filters["outcome"])
    if filters.get("state") is not None:
        query = query.where(state_expression(now) == filters["state"])
    if filters.get("routing_key") is not None:
        query = query.where(c.source_routing_key == filters["routing_key"])
    if filters.get("since") is not None:
        query = query.where(c.created_at >= filters["since"])
    if filters.get("before") is not None:
        query = query.where(c.created_at < filters["before"])
    query = keyset_page(query, c.created_at, c.id, limit=limit, cursor=cursor, filters=filters)
    rows = list((await conn.execute(query)).all())
    following = next_cursor(rows, limit, "created_at", filters)
    return [list_item(dict(r._mapping), now) for r in rows], following


async def page_dlq(
    conn: AsyncConnection, *, filters: Mapping[str, Any], limit: int, cursor: str | None, now: datetime
) -> tuple[list[dict[str, Any]], str | None]:
    """DLQ rows, newest `dlq_at` first."""
    c = events.c
    query = select(events).where(c.dlq_at.is_not(None))
    if filters.get("name") is not None:
        query = query.where(c.name == filters["name"])
    if filters.get("reason") is not None:
        query = query.where(c.dlq_reason == filters["reason"])
    if filters.get("routing_key") is not None:
        query = query.where(c.source_routing_key == filters["routing_key"])
    query = keyset_page(query, c.dlq_at, c.id, limit=limit, cursor=cursor, filters=filters)
    rows = list((await conn.execute(query)).all())
    following = next_cursor(rows, limit, "dlq_at", filters)
    return [list_item(dict(r._mapping), now) for r in rows], following


async def runs_of_event(conn: AsyncConnection, event_id: str) -> list[dict[str, Any]]:
    """The runs an event dispatched."""
    rows = await conn.execute(
        select(runs.c.id, runs.c.workflow, runs.c.repo, runs.c.status, runs.c.created_at)
        .where(runs.c.event_id == event_id)
        .order_by(runs.c.created_at, runs.c.id)
    )
    return [
        {
            "run_id": r.id,
            "workflow_name": r.workflow,
            "repo": r.repo,
            "status": r.status,
            "created_at": r.created_at,
        }
        for r in rows
    ]


async def dlq_retry(conn: AsyncConnection, event_id: str) -> bool:
    """Back to pending: clear DLQ and lease, attempts 0, keep last_error; False if not in the DLQ."""
    c = events.c
    result = await conn.execute(
        update(events)
        .where(c.id == event_id, c.dlq_at.is_not(None))
        .values(
            dlq_at=None,
            dlq_reason=None,
            lease_owner=None,
            lease_expires_at=None,
            attempts=0,
            next_retry_at=None,
        )
    )
    return result.rowcount == 1


async def dlq_discard(conn: AsyncConnection, event_id: str) -> bool:
    """Hard delete a dead letter; False if not in the DLQ."""
    result = await conn.execute(delete(events).where(events.c.id == event_id, events.c.dlq_at.is_not(None)))
    return result.rowcount == 1


async def count_dlq(conn: AsyncConnection, *, routing_key: str | None) -> int:
    """How many dead letters (only `routing_key`'s when given)."""
    query = select(func.count()).select_from(events).where(events.c.dlq_at.is_not(None))
    if routing_key is not None:
        query = query.where(events.c.source_routing_key == routing_key)
    return int((await conn.execute(query)).scalar_one())


async def backlog_counts(conn: AsyncConnection) -> tuple[int, int]:
    """(unfinished rows, DLQ rows) for the gauges."""
    backlog = (await conn.execute(select(func.count()).select_from(events).where(_unfinished()))).scalar_one()
    depth = (
        await conn.execute(select(func.count()).select_from(events).where(events.c.dlq_at.is_not(None)))
    ).scalar_one()
    return int(backlog), int(depth)
