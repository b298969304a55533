"""All SQL of ingest: sources and deliveries."""

from __future__ import annotations

import gzip
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import bindparam, delete, func, insert, or_, select, tuple_, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.admin.pagination import keyset_page, next_cursor
from conveyor.db.channels import SOURCE_CHANNEL
from conveyor.db.dialect import dialect_insert, notify
from conveyor.db.tables import deliveries, runs, sources
from conveyor.ingest.providers.base import SourceRow
from conveyor.ingest.truncation import should_truncate
from conveyor.model.ids import new_id, utc_now

SOURCE_FIELDS = tuple(SourceRow.__dataclass_fields__)

# The statements every delivery runs, built once: building a statement and its cache key costs more
# Python time than SQLAlchemy's execution of an already compiled one.
_SOURCE_BY_ID = select(sources).where(sources.c.id == bindparam("source_id"))
_LEASE = (
    update(deliveries)
    .where(
        deliveries.c.id == bindparam("row_id"),
        deliveries.c.status == "received",
        or_(deliveries.c.lease_until.is_(None), deliveries.c.lease_until < bindparam("now")),
    )
    .values(lease_owner=bindparam("owner"), lease_until=bindparam("until"))
)
_FINISH = (
    update(deliveries)
    .where(
        deliveries.c.id == bindparam("row_id"),
        deliveries.c.lease_owner == bindparam("owner"),
        deliveries.c.status == "received",
    )
    .values(
        status=bindparam("new_status"),
        decisions=bindparam("new_decisions", type_=deliveries.c.decisions.type),
        run_count=bindparam("new_run_count"),
        skipped=bindparam("new_skipped"),
        error=bindparam("new_error"),
        processed_at=bindparam("now"),
        lease_owner=None,
        lease_until=None,
    )
)


def _source(row: Any) -> SourceRow:
    mapping = row._mapping
    return SourceRow(**{name: mapping[name] for name in SOURCE_FIELDS})


async def insert_source(conn: AsyncConnection, values: Mapping[str, Any]) -> SourceRow:
    """Create a source; raises `IntegrityError` on a duplicate name or routing key."""
    now = utc_now()
    row = {"id": new_id(), "created_at": now, "updated_at": now, "enabled": True, **values}
    await conn.execute(insert(sources).values(**row))
    found = await get_source(conn, row["id"])
    assert found is not None
    return found


async def insert_new_source(conn: AsyncConnection, values: Mapping[str, Any]) -> SourceRow | None:
    """`insert_source`, or None when a source of that name or routing key exists (in a savepoint: the
    caller's transaction stays usable)."""
    try:
        async with conn.begin_nested():
            return await insert_source(conn, values)
    except IntegrityError:
        return None


async def get_source(conn: AsyncConnection, source_id: str) -> SourceRow | None:
    """A source by id."""
    row = (await conn.execute(_SOURCE_BY_ID, {"source_id": source_id})).first()
    return _source(row) if row else None


async def find_source(conn: AsyncConnection, ref: str) -> SourceRow | None:
    """A source by id, name or routing key (what CLI users type)."""
    query = select(sources).where(
        or_(sources.c.id == ref, sources.c.name == ref, sources.c.routing_key == ref)
    )
    row = (await conn.execute(query)).first()
    return _source(row) if row else None


async def find_public_source(conn: AsyncConnection, ref: str) -> SourceRow | None:
    """A source by id, name or routing key whose badges are public; None for any other (docs/design/execution.md §11)."""
    query = select(sources).where(
        or_(sources.c.id == ref, sources.c.name == ref, sources.c.routing_key == ref),
        sources.c.public_badges.is_(True),
    )
    row = (await conn.execute(query)).first()
    return _source(row) if row else None


async def list_sources(conn: AsyncConnection, routing_key: str | None = None) -> list[dict[str, Any]]:
    """Every source (or one routing key's), newest first."""
    query = select(sources).order_by(sources.c.created_at.desc(), sources.c.id.desc())
    if routing_key is not None:
        query = query.where(sources.c.routing_key == routing_key)
    return [dict(r._mapping) for r in await conn.execute(query)]


async def source_row(conn: AsyncConnection, source_id: str) -> dict[str, Any] | None:
    """A source's full row."""
    row = (await conn.execute(select(sources).where(sources.c.id == source_id))).first()
    return dict(row._mapping) if row else None


async def update_source(conn: AsyncConnection, source_id: str, values: Mapping[str, Any]) -> None:
    """Change a source's settable columns (every coordinator's source cache drops it at commit)."""
    await conn.execute(
        update(sources).where(sources.c.id == source_id).values(**values, updated_at=utc_now())
    )
    await notify(conn, SOURCE_CHANNEL, source_id)


async def delete_source(conn: AsyncConnection, source_id: str) -> bool:
    """Remove a source; False when it did not exist."""
    await notify(conn, SOURCE_CHANNEL, source_id)
    return (await conn.execute(delete(sources).where(sources.c.id == source_id))).rowcount == 1


@dataclass(frozen=True)
class NewDelivery:
    """A verified delivery to store: what the webhook and trigger routes parsed from the request."""

    source: SourceRow
    delivery_id: str
    event: str
    action: str | None
    headers: Mapping[str, str]
    body: bytes


async def insert_deliveries(conn: AsyncConnection, new: Sequence[NewDelivery]) -> list[tuple[str, bool]]:
    """Store deliveries unless their source already has that delivery id; (row id, created) for each.

    One statement for the lot: `INSERT … ON CONFLICT (source_id, delivery_id) DO NOTHING RETURNING id`;
    the unique constraint is the dedup, so a redelivery finds the existing row and changes nothing, and
    a delivery id repeated within `new` is stored once (the later ones answer with the first one's row).
    A row the database rejects fails the whole statement: the caller retries the others without it.
    """
    now = utc_now()
    rows: list[dict[str, Any]] = [
        {
            "id": new_id(),
            "org_id": item.source.org_id,
            "source_id": item.source.id,
            "delivery_id": item.delivery_id,
            "event": item.event,
            "action": item.action,
            "headers": dict(item.headers),
            "body": gzip.compress(item.body, compresslevel=5),
            "body_sha256": hashlib.sha256(item.body).hexdigest(),
            "received_at": now,
            "status": "received",
            "next_attempt_at": now,
        }
        for item in new
    ]
    # The rows as parameters, not `.values(rows)`: SQLAlchemy then sends one multi-row INSERT from a
    # statement compiled once ("insertmanyvalues"), where `.values(rows)` is compiled again for each call.
    statement = (
        dialect_insert(conn, deliveries)
        .on_conflict_do_nothing(index_elements=["source_id", "delivery_id"])
        .returning(deliveries.c.id)
    )
    inserted = {str(row_id) for row_id in (await conn.execute(statement, rows)).scalars()}
    existing: dict[tuple[str, str], str] = {}
    known = [(r["source_id"], r["delivery_id"]) for r in rows if r["id"] not in inserted]
    if known:
        query = select(deliveries.c.id, deliveries.c.source_id, deliveries.c.delivery_id).where(
            tuple_(deliveries.c.source_id, deliveries.c.delivery_id).in_(known)
        )
        existing = {(s, d): str(i) for i, s, d in (await conn.execute(query)).all()}
    return [
        (r["id"], True) if r["id"] in inserted else (existing[(r["source_id"], r["delivery_id"])], False)
        for r in rows
    ]


async def insert_delivery(conn: AsyncConnection, new: NewDelivery) -> tuple[str, bool]:
    """Store one delivery unless its source already has that delivery id: (row id, created)."""
    return (await insert_deliveries(conn, [new]))[0]


async def lease_delivery(conn: AsyncConnection, row_id: str, owner: str, lease_s: float) -> bool:
    """Take the processing lease of a `received` delivery; False when another holder has it."""
    now = utc_now()
    parameters = {"row_id": row_id, "now": now, "owner": owner, "until": now + timedelta(seconds=lease_s)}
    return (await conn.execute(_LEASE, parameters)).rowcount == 1


async def release_leases(conn: AsyncConnection, owner: str) -> int:
    """Clear the leases `owner` holds on deliveries not yet processed; how many were freed."""
    result = await conn.execute(
        update(deliveries)
        .where(deliveries.c.lease_owner == owner, deliveries.c.status == "received")
        .values(lease_owner=None, lease_until=None)
    )
    return int(result.rowcount or 0)


async def count_delivery_runs(conn: AsyncConnection, row_id: str) -> int:
    """How many runs a delivery created (over every processing pass)."""
    return int(
        (
            await conn.execute(select(func.count()).select_from(runs).where(runs.c.delivery_id == row_id))
        ).scalar_one()
    )


async def get_delivery(conn: AsyncConnection, row_id: str) -> dict[str, Any] | None:
    """A delivery row (body still compressed)."""
    row = (await conn.execute(select(deliveries).where(deliveries.c.id == row_id))).first()
    return dict(row._mapping) if row else None


async def delivery_org(conn: AsyncConnection, row_id: str) -> str | None:
    """The org a delivery belongs to (None when the row is gone)."""
    found = (
        await conn.execute(select(deliveries.c.org_id).where(deliveries.c.id == row_id))
    ).scalar_one_or_none()
    return str(found) if found is not None else None


def delivery_body(row: Mapping[str, Any]) -> bytes:
    """The raw body of a stored delivery."""
    return gzip.decompress(row["body"])


async def finish_delivery(
    conn: AsyncConnection,
    row_id: str,
    owner: str,
    *,
    status: str,
    decisions: Any = None,
    run_count: int = 0,
    skipped: str | None = None,
    error: str | None = None,
    cut_body: bytes | None = None,
) -> bool:
    """Record the outcome (fenced by the lease owner) and clear the lease.

    `cut_body` (docs/design/execution.md §1.1) replaces the stored body, unless the delivery ends `failed`:
    `replay` processes a failed delivery's stored body again. `body_sha256` keeps naming the body received.
    """
    parameters = {
        "row_id": row_id,
        "owner": owner,
        "new_status": status,
        "new_decisions": decisions,
        "new_run_count": run_count,
        "new_skipped": skipped,
        "new_error": error,
        "now": utc_now(),
    }
    finished = (await conn.execute(_FINISH, parameters)).rowcount == 1
    if finished and cut_body is not None and should_truncate(status):
        await conn.execute(
            update(deliveries)
            .where(deliveries.c.id == row_id)
            .values(body=gzip.compress(cut_body, compresslevel=5))
        )
    return finished


async def retry_delivery_later(
    conn: AsyncConnection, row_id: str, owner: str, *, error: str, delays_s: tuple[float, ...]
) -> str:
    """After a transient failure: back off, or give up (`failed`) after the last delay. Returns the status."""
    row = await get_delivery(conn, row_id)
    if row is None or row["lease_owner"] != owner:
        return "lost"
    attempts = int(row["attempts"]) + 1
    values: dict[str, Any] = {
        "attempts": attempts,
        "error": error[:2000],
        "lease_owner": None,
        "lease_until": None,
    }
    if attempts >= len(delays_s):
        values.update(status="failed", processed_at=utc_now())
    else:
        values.update(next_attempt_at=utc_now() + timedelta(seconds=delays_s[attempts - 1]))
    await conn.execute(update(deliveries).where(deliveries.c.id == row_id).values(**values))
    return str(values.get("status", "received"))


async def due_deliveries(conn: AsyncConnection, now: datetime, limit: int = 100) -> list[str]:
    """`received` deliveries whose next attempt has come and whose lease is free or expired."""
    query = (
        select(deliveries.c.id)
        .where(
            deliveries.c.status == "received",
            deliveries.c.next_attempt_at <= now,
            or_(deliveries.c.lease_until.is_(None), deliveries.c.lease_until < now),
        )
        .order_by(deliveries.c.next_attempt_at)
        .limit(limit)
    )
    return [str(r) for r in (await conn.execute(query)).scalars()]


async def replay_delivery(conn: AsyncConnection, row_id: str) -> bool:
    """Reset a `failed` delivery to `received`; False unless it was failed."""
    result = await conn.execute(
        update(deliveries)
        .where(deliveries.c.id == row_id, deliveries.c.status == "failed")
        .values(status="received", attempts=0, next_attempt_at=utc_now(), error=None, processed_at=None)
    )
    return result.rowcount == 1


DELIVERY_LIST_COLUMNS = tuple(c for c in deliveries.c if c.name not in ("body", "headers", "decisions"))


async def page_deliveries(
    conn: AsyncConnection, *, filters: Mapping[str, Any], limit: int, cursor: str | None
) -> tuple[list[dict[str, Any]], str | None]:
    """Deliveries newest first, filtered by source, status, routing key and time."""
    query = select(*DELIVERY_LIST_COLUMNS, sources.c.routing_key).join(
        sources, sources.c.id == deliveries.c.source_id
    )
    if filters.get("source_id"):
        query = query.where(deliveries.c.source_id == filters["source_id"])
    if filters.get("status"):
        query = query.where(deliveries.c.status == filters["status"])
    if filters.get("routing_key"):
        query = query.where(sources.c.routing_key == filters["routing_key"])
    if filters.get("since"):
        query = query.where(deliveries.c.received_at >= filters["since"])
    if filters.get("before"):
        query = query.where(deliveries.c.received_at < filters["before"])
    query = keyset_page(
        query, deliveries.c.received_at, deliveries.c.id, limit=limit, cursor=cursor, filters=filters
    )
    rows = list((await conn.execute(query)).all())
    following = next_cursor(rows, limit, "received_at", filters)
    return [dict(r._mapping) for r in rows], following


async def prune_finished_deliveries(conn: AsyncConnection, cutoff: datetime, limit: int) -> int:
    """Delete up to `limit` finished deliveries received and finished before `cutoff`
    (docs/design/execution.md §3).

    Only finished rows go: a `received` one is still owed processing. Once pruned, a redelivery
    of the same id is stored as a new delivery, so `webhook_dedup_ttl_ms` bounds deduplication too.
    """
    some = (
        select(deliveries.c.id)
        .where(
            deliveries.c.received_at < cutoff,
            deliveries.c.status != "received",
            or_(deliveries.c.processed_at.is_(None), deliveries.c.processed_at < cutoff),
        )
        .order_by(deliveries.c.received_at, deliveries.c.id)
        .limit(limit)
    )
    result = await conn.execute(delete(deliveries).where(deliveries.c.id.in_(some)))
    return int(result.rowcount or 0)
