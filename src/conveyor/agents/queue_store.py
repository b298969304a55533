"""SQL of the queue's admin surface: read `dispatch_queue` with its jobs, and clear queued jobs.

The dispatcher owns claiming and requeueing (`execution`); this module only reads rows and cancels
jobs that are still waiting, each with a guarded UPDATE so a concurrent claim wins cleanly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.admin.pagination import encode_cursor, keyset_page
from conveyor.db.tables import dispatch_queue, jobs, runs
from conveyor.execution.history import record_dispatch_ended

CLEAR_REASON = "admin_clear"
LISTED_STATES = ("pending", "claimed")

_COLUMNS = (
    dispatch_queue.c.job_id,
    dispatch_queue.c.run_id,
    runs.c.number.label("run_number"),
    runs.c.workflow,
    runs.c.routing_key,
    jobs.c.display_name,
    jobs.c.status.label("job_status"),
    jobs.c.reason.label("job_reason"),
    dispatch_queue.c.state,
    dispatch_queue.c.attempts,
    dispatch_queue.c.agent_id,
    dispatch_queue.c.bound_agent_id,
    dispatch_queue.c.owner_instance_id,
    dispatch_queue.c.exact_labels,
    dispatch_queue.c.runs_on,
    dispatch_queue.c.priority,
    dispatch_queue.c.enqueued_at,
    dispatch_queue.c.not_before,
    dispatch_queue.c.expires_at,
    dispatch_queue.c.claimed_at,
    dispatch_queue.c.ack_deadline,
    dispatch_queue.c.unschedulable,
    dispatch_queue.c.unschedulable_since,
    dispatch_queue.c.last_provisioning_error,
    dispatch_queue.c.last_error,
)


def waiting_note(row: dict[str, Any]) -> str | None:
    """The row's one-line why: `unschedulable: <reason>` or `waiting: <note>` (docs/design/execution.md §5).

    The dispatcher stores the text in `unschedulable` (mirrored in the job's reason); a text without
    its prefix is unschedulable while `unschedulable_since` is set, else a waiting note.
    """
    if row["state"] != "pending":
        return None
    for text in (row.get("unschedulable"), row.get("job_reason")):
        if text and text.startswith(("unschedulable:", "waiting:")):
            return str(text)
    text = row.get("unschedulable")
    if text:
        return f"unschedulable: {text}" if row.get("unschedulable_since") else f"waiting: {text}"
    return "waiting: for a matching agent"


def _base_query() -> Any:
    return (
        select(*_COLUMNS)
        .join(jobs, jobs.c.id == dispatch_queue.c.job_id)
        .join(runs, runs.c.id == dispatch_queue.c.run_id)
    )


def _shown(row: Any) -> dict[str, Any]:
    item = dict(row._mapping)
    item["note"] = waiting_note(item)
    return item


async def page_queue(
    conn: AsyncConnection, *, states: tuple[str, ...], limit: int, cursor: str | None
) -> tuple[list[dict[str, Any]], str | None]:
    """Queue rows in `states` with their job and run, newest first."""
    filters = {"state": ",".join(states)}
    query = _base_query().where(dispatch_queue.c.state.in_(states))
    query = keyset_page(
        query,
        dispatch_queue.c.enqueued_at,
        dispatch_queue.c.job_id,
        limit=limit,
        cursor=cursor,
        filters=filters,
    )
    rows = [_shown(r) for r in await conn.execute(query)]
    following = None
    if len(rows) > limit:
        del rows[limit:]
        following = encode_cursor(rows[-1]["enqueued_at"], rows[-1]["job_id"], filters)
    return rows, following


async def get_queue_row(conn: AsyncConnection, job_id: str) -> dict[str, Any] | None:
    """One queue row with its job and run."""
    row = (await conn.execute(_base_query().where(dispatch_queue.c.job_id == job_id))).first()
    return _shown(row) if row else None


@dataclass
class Cleared:
    """What `clear_queued_jobs` cancelled."""

    job_ids: list[str] = field(default_factory=list)
    run_ids: list[str] = field(default_factory=list)


async def clear_queued_jobs(conn: AsyncConnection, now: datetime) -> Cleared:
    """Cancel every job still waiting in the queue (row `pending`, job `queued`), in `conn`'s transaction.

    Rows are locked first (`FOR UPDATE SKIP LOCKED` on PostgreSQL; SQLite's BEGIN IMMEDIATE already
    excludes other writers), in the dispatcher's order (queue row, then job), so a row being
    claimed right now is skipped rather than deadlocked on; the job UPDATE is guarded on `queued`,
    so a job claimed in between keeps its claim.
    """
    candidates = (
        await conn.execute(
            select(dispatch_queue)
            .where(dispatch_queue.c.state == "pending")
            .order_by(dispatch_queue.c.enqueued_at, dispatch_queue.c.job_id)
            .with_for_update(skip_locked=True)
        )
    ).all()
    cleared = Cleared()
    for row in candidates:
        changed = await conn.execute(
            update(jobs)
            .where(jobs.c.id == row.job_id, jobs.c.status.in_(("queued",)))
            .values(status="cancelled", reason=CLEAR_REASON, blocked_on=None, finished_at=now)
        )
        if changed.rowcount != 1:
            continue
        await conn.execute(
            delete(dispatch_queue).where(
                dispatch_queue.c.job_id == row.job_id, dispatch_queue.c.state == "pending"
            )
        )
        await record_dispatch_ended(
            conn, row.job_id, row, ended_at=now, outcome="cancelled", detail=CLEAR_REASON
        )
        cleared.job_ids.append(row.job_id)
        if row.run_id not in cleared.run_ids:
            cleared.run_ids.append(row.run_id)
    return cleared
