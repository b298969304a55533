"""The dispatch queue's SQL: claim a row for an agent, requeue it, count what waits (execution.md §5).

The row is the only truth. PostgreSQL claims with `FOR UPDATE SKIP LOCKED` so coordinators sharing
the queue never claim one row twice; SQLite has one writer (`BEGIN IMMEDIATE`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import literal, select, update
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.db.tables import dispatch_queue, jobs
from conveyor.execution.lifecycle import Effects, finish_job, lock_job_for_change, record_dispatch_ended
from conveyor.execution.transitions import transition
from conveyor.matching import labels_satisfy, runs_on_from_json

CANDIDATES = 16


@dataclass(frozen=True)
class AgentSlot:
    """An agent that can take one more job."""

    agent_id: str
    labels: tuple[str, ...]
    mandatory_labels: tuple[str, ...]
    # A connected worker's capacity (cluster.md §4): it never claims a row that rerouting handed
    # back to local capacity (the job's `reroute_tried` is set once its hops or candidates ran out).
    remote: bool = False


@dataclass(frozen=True)
class Claim:
    """A row claimed for an agent; the job is now `dispatched`."""

    job_id: str
    run_id: str
    attempt: int


def agent_can_take(runs_on: dict[str, Any], agent: AgentSlot) -> bool:
    """Full label match (pure): every matcher matches a label, no exclude does, mandatory labels named."""
    if not labels_satisfy(runs_on_from_json(runs_on), agent.labels):
        return False
    exact = {m["pattern"].lower() for m in runs_on.get("labels", []) if m.get("kind") == "exact"}
    return all(label in exact for label in agent.mandatory_labels)


async def claim_for(
    conn: AsyncConnection,
    agent: AgentSlot,
    *,
    owner: str,
    now: datetime,
    ack_timeout_ms: int,
    bound_job_id: str | None = None,
) -> Claim | None:
    """Claim the best pending row this agent can run (or exactly its bound row)."""
    query = select(
        dispatch_queue.c.job_id, dispatch_queue.c.run_id, dispatch_queue.c.runs_on, dispatch_queue.c.attempts
    ).where(dispatch_queue.c.state == "pending", dispatch_queue.c.not_before <= now)
    if bound_job_id is not None:
        query = query.where(dispatch_queue.c.job_id == bound_job_id)
    if agent.remote:
        handed_back = select(jobs.c.id).where(
            jobs.c.id == dispatch_queue.c.job_id, jobs.c.reroute_tried.is_not(None)
        )
        query = query.where(~handed_back.exists())
    if conn.dialect.name == "postgresql":
        # Pre-filter on the exact matchers; the full match below decides.
        query = query.where(dispatch_queue.c.exact_labels.op("<@")(literal(sorted(agent.labels), JSONB())))
        query = query.order_by(dispatch_queue.c.priority.desc(), dispatch_queue.c.enqueued_at).limit(
            CANDIDATES
        )
        query = query.with_for_update(skip_locked=True)
        candidates = list(await conn.execute(query))
    else:
        query = query.order_by(dispatch_queue.c.priority.desc(), dispatch_queue.c.enqueued_at)
        candidates = list(await conn.execute(query))
    for row in candidates:
        if not agent_can_take(row.runs_on, agent):
            continue
        attempt = row.attempts + 1
        await conn.execute(
            update(dispatch_queue)
            .where(dispatch_queue.c.job_id == row.job_id, dispatch_queue.c.state == "pending")
            .values(
                state="claimed",
                owner_instance_id=owner,
                agent_id=agent.agent_id,
                attempts=attempt,
                claimed_at=now,
                ack_deadline=now + timedelta(milliseconds=ack_timeout_ms),
                unschedulable=None,
                unschedulable_since=None,
            )
        )
        applied = await transition(
            conn, "job", row.job_id, "dispatched", agent_id=agent.agent_id, instance_id=owner
        )
        if applied != "changed":
            continue
        return Claim(row.job_id, row.run_id, attempt)
    return None


async def requeue(
    conn: AsyncConnection,
    job_id: str,
    *,
    outcome: str,
    detail: str | None,
    now: datetime,
    delay_ms: int = 0,
    max_attempts: int,
    agent_id: str | None = None,
    attempt: int | None = None,
    ack_due_before: datetime | None = None,
    reason: str | None = None,
    reroute_hop: int | None = None,
) -> Effects | None:
    """Give a claimed row back (reject, ack timeout, agent lost before start); exhaust after max attempts.

    `reason` and `reroute_hop` describe an ended offer to a worker (its history row names them).

    Only a row still `claimed` (by `agent_id`, at `attempt`, with an ack deadline before
    `ack_due_before`, when given) is given back; None otherwise. Callers decide from what they read
    earlier, and by now the agent may have acked or started the job, or the row may be another
    agent's claim: requeuing any of those would hand one job out twice.
    """
    query = select(dispatch_queue).where(
        dispatch_queue.c.job_id == job_id, dispatch_queue.c.state == "claimed"
    )
    if agent_id is not None:
        query = query.where(dispatch_queue.c.agent_id == agent_id)
    if attempt is not None:
        query = query.where(dispatch_queue.c.attempts == attempt)
    if ack_due_before is not None:
        query = query.where(
            dispatch_queue.c.ack_deadline.is_not(None), dispatch_queue.c.ack_deadline < ack_due_before
        )
    # The queue row is locked (after its run, in the order every job change takes): a concurrent
    # `job.started` commits first or waits for us.
    await lock_job_for_change(conn, job_id)
    row = (await conn.execute(query)).first()
    if row is None:
        return None
    await record_dispatch_ended(
        conn,
        job_id,
        row,
        ended_at=now,
        outcome=outcome,
        detail=detail,
        reason=reason,
        reroute_hop=reroute_hop,
    )
    if row.attempts >= max_attempts:
        return await finish_job(
            conn, job_id, "failed", reason="dispatch_attempts_exhausted", queue_outcome="exhausted"
        )
    await conn.execute(
        update(dispatch_queue)
        .where(dispatch_queue.c.job_id == job_id)
        .values(
            state="pending",
            agent_id=None,
            owner_instance_id=None,
            claimed_at=None,
            ack_deadline=None,
            not_before=now + timedelta(milliseconds=delay_ms),
            last_error=detail,
        )
    )
    await transition(conn, "job", job_id, "queued", only_from={"dispatched"}, agent_id=None)
    return Effects()


async def record_wait_note(conn: AsyncConnection, job_id: str, note: str, since: datetime | None) -> None:
    """Store why a pending row waits (`waiting: …` / `unschedulable: …`), mirrored in the job's reason."""
    await conn.execute(
        update(dispatch_queue)
        .where(dispatch_queue.c.job_id == job_id)
        .values(unschedulable=note, unschedulable_since=since)
    )
    await conn.execute(update(jobs).where(jobs.c.id == job_id, jobs.c.status == "queued").values(reason=note))
