"""Failure-lifecycle batch windows (docs/design/events.md §3.4): buffer failed runs, emit one batch per
window."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.db.dialect import dialect_insert
from conveyor.db.tables import event_batch_items, event_batch_windows
from conveyor.events.emit import emit_system
from conveyor.events.models import FAILED_BATCH, EmitRequest, EventSettings
from conveyor.model.ids import new_id


@dataclass(frozen=True)
class BatchItem:
    """One failed run for a window."""

    run_id: str
    repo: str
    workflow_name: str
    failure_class: str | None
    sender: str | None
    chain_depth: int


async def append(
    conn: AsyncConnection,
    *,
    registration_id: str,
    org_id: str,
    routing_key: str,
    repo: str,
    window_ms: int,
    item: BatchItem,
    now: datetime,
) -> None:
    """Open-or-reuse the registration's window and add the run once (UNIQUE(window_id, run_id))."""
    await conn.execute(
        dialect_insert(conn, event_batch_windows)
        .values(
            id=new_id(),
            registration_id=registration_id,
            org_id=org_id,
            routing_key=routing_key,
            repo=repo,
            opened_at=now,
            closes_at=now + timedelta(milliseconds=window_ms),
        )
        .on_conflict_do_nothing(index_elements=["registration_id"])
    )
    query = select(event_batch_windows.c.id).where(event_batch_windows.c.registration_id == registration_id)
    if conn.dialect.name == "postgresql":
        query = query.with_for_update()
    window_id = (await conn.execute(query)).scalar_one()
    await conn.execute(
        dialect_insert(conn, event_batch_items)
        .values(
            window_id=window_id,
            run_id=item.run_id,
            repo=item.repo,
            workflow_name=item.workflow_name,
            failure_class=item.failure_class,
            sender=item.sender,
            chain_depth=item.chain_depth,
            added_at=now,
        )
        .on_conflict_do_nothing(index_elements=["window_id", "run_id"])
    )


async def close_due(conn: AsyncConnection, now: datetime, settings: EventSettings, limit: int = 200) -> int:
    """Close windows with `closes_at <= now`: read items, delete the window, emit `__workflows_failed_batch`."""
    w = event_batch_windows.c
    query = select(event_batch_windows).where(w.closes_at <= now).order_by(w.closes_at).limit(limit)
    if conn.dialect.name == "postgresql":
        query = query.with_for_update(skip_locked=True)
    windows = [dict(r._mapping) for r in await conn.execute(query)]
    for window in windows:
        items = [
            dict(r._mapping)
            for r in await conn.execute(
                select(event_batch_items)
                .where(event_batch_items.c.window_id == window["id"])
                .order_by(event_batch_items.c.added_at, event_batch_items.c.run_id)
            )
        ]
        await conn.execute(delete(event_batch_windows).where(w.id == window["id"]))
        if not items:
            continue
        runs: list[dict[str, Any]] = [
            {
                "run_id": i["run_id"],
                "repo": i["repo"],
                "workflow_name": i["workflow_name"],
                "failure_class": i["failure_class"],
                "sender": i["sender"],
            }
            for i in items[: settings.batch_max_runs]
        ]
        await emit_system(
            conn,
            EmitRequest(
                name=FAILED_BATCH,
                origin="system",
                org_id=window["org_id"],
                payload={
                    "registration_id": window["registration_id"],
                    "routing_key": window["routing_key"],
                    "repo": window["repo"],
                    "window_opened_at": window["opened_at"].isoformat(),
                    "window_closed_at": now.isoformat(),
                    "total": len(items),
                    "runs": runs,
                },
                source_routing_key=window["routing_key"],
                source_repo=window["repo"],
                chain_depth=max(i["chain_depth"] for i in items) + 1,
                dedup_key=f"batch:{window['id']}",
            ),
            settings,
        )
    return len(windows)


async def open_windows(conn: AsyncConnection) -> int:
    """How many batch windows are open (the gauge)."""
    return int((await conn.execute(select(func.count()).select_from(event_batch_windows))).scalar_one())
