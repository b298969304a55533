"""What a run keeps of what happened to it and its jobs: the run's timeline (`run_timeline`) and a
`dispatch_history` row per dispatch attempt that ended (docs/design/execution.md §5).

Every part of the execution package, and the cluster and scaler parts that move jobs, write these; they sit
below `lifecycle` so that all of them import in one direction.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import delete, insert
from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.db.tables import dispatch_history, dispatch_queue, run_timeline
from conveyor.model.ids import new_id, utc_now

# Inserts every job's end writes, built once (their parameters name the columns).
_TIMELINE_INSERT = insert(run_timeline)
_HISTORY_INSERT = insert(dispatch_history)


async def timeline(
    conn: AsyncConnection, run_id: str, job_id: str | None, source: str, kind: str, detail: Any = None
) -> None:
    """Append what happened and why to the run's timeline."""
    await conn.execute(
        _TIMELINE_INSERT,
        {
            "id": new_id(),
            "run_id": run_id,
            "job_id": job_id,
            "at": utc_now(),
            "source": source,
            "kind": kind,
            "detail": detail,
        },
    )


async def record_dispatch_ended(
    conn: AsyncConnection,
    job_id: str,
    claim: Any,
    *,
    ended_at: datetime,
    outcome: str,
    detail: str | None,
    reason: str | None = None,
    reroute_hop: int | None = None,
) -> None:
    """Write the `dispatch_history` row of a dispatch attempt that ended; `claim` is its queue row
    (anything with `attempts`, `agent_id`, `owner_instance_id`, `enqueued_at`, `claimed_at`)."""
    await conn.execute(
        _HISTORY_INSERT,
        {
            "id": new_id(),
            "job_id": job_id,
            "attempt": claim.attempts,
            "agent_id": claim.agent_id,
            "owner_instance_id": claim.owner_instance_id,
            "enqueued_at": claim.enqueued_at,
            "claimed_at": claim.claimed_at,
            "ended_at": ended_at,
            "outcome": outcome,
            "detail": detail,
            "reason": reason,
            "reroute_hop": reroute_hop,
        },
    )


async def remove_queue_row(
    conn: AsyncConnection, job_id: str, outcome: str, detail: str | None = None
) -> None:
    """Delete a job's queue row and write its final `dispatch_history` row (`DELETE … RETURNING`: no read)."""
    row = (
        await conn.execute(
            delete(dispatch_queue)
            .where(dispatch_queue.c.job_id == job_id)
            .returning(
                dispatch_queue.c.attempts,
                dispatch_queue.c.agent_id,
                dispatch_queue.c.owner_instance_id,
                dispatch_queue.c.enqueued_at,
                dispatch_queue.c.claimed_at,
            )
        )
    ).first()
    if row is None:
        return
    await record_dispatch_ended(conn, job_id, row, ended_at=utc_now(), outcome=outcome, detail=detail)
