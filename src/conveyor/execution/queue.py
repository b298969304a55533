"""The dispatch queue's SQL: claim a row for an agent, requeue it, count what waits
(docs/design/execution.md §5).

The row is the only truth. PostgreSQL claims with `FOR UPDATE SKIP LOCKED` so coordinators sharing
the queue never claim one row twice; SQLite has one writer (`BEGIN IMMEDIATE`). PostgreSQL's claim is
hand-written SQL on the driver (`execution/sql.py`, run by `db/driver_sql.py`): it runs for every dispatched job.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.db.driver_sql import Jsonb, fetch_all, fetch_one
from conveyor.db.tables import dispatch_queue, jobs
from conveyor.execution import sql
from conveyor.execution.history import record_dispatch_ended
from conveyor.execution.lifecycle import Effects, finish_job, lock_job_for_change
from conveyor.execution.queue_match import AgentSlot as AgentSlot
from conveyor.execution.queue_match import agent_can_take as agent_can_take
from conveyor.execution.queue_match import claim_labels
from conveyor.execution.transitions import guard_sources, transition, unchanged

CANDIDATES = 16


@dataclass(frozen=True)
class Claim:
    """A row claimed for an agent; the job is now `dispatched`."""

    job_id: str
    run_id: str
    attempt: int


@dataclass(frozen=True)
class ClaimScope:
    """The pending rows one agent may claim now: any its labels match, only `job_id`, or none."""

    any_row: bool
    job_id: str | None = None

    @property
    def closed(self) -> bool:
        return not self.any_row and self.job_id is None


ANY_ROW = ClaimScope(any_row=True)
NO_ROW = ClaimScope(any_row=False)


def single_use_scope(*, single_use: bool, bound_job_id: str | None, dispatched: bool) -> ClaimScope:
    """What an agent may still be offered (pure; docs/design/execution.md §5, "Single use").

    A single-use agent (ephemeral, or started by a scaler) is sent one `job.dispatch` in its life: its
    spawn's bound job, whether or not that job still waited when it registered, else (a warm or
    hand-started ephemeral agent) the first job its labels match; after that dispatch nothing, even
    when that job comes back to the queue. The dispatch carries the job's secrets, so this is the
    orchestrator's decision: the agent program refusing a second job would come too late.
    """
    if not single_use:
        return ANY_ROW
    if dispatched:
        return NO_ROW
    return ANY_ROW if bound_job_id is None else ClaimScope(any_row=False, job_id=bound_job_id)


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
    if sql.hand_written(conn):
        return await _claim_on_postgresql(
            conn, agent, owner=owner, now=now, ack_timeout_ms=ack_timeout_ms, bound_job_id=bound_job_id
        )
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
    query = query.order_by(
        dispatch_queue.c.priority.desc(), dispatch_queue.c.enqueued_at, dispatch_queue.c.job_id
    ).limit(CANDIDATES)
    # Every pending row may be considered, but a page at a time: reading (and decoding) the whole queue
    # for each claim made a deep queue slow to drain. SQLite's writer excludes every other, so the rows
    # cannot move between pages, except those this claim tried and left `claimed`.
    terms = _ClaimTerms(owner, agent.agent_id, now, now + timedelta(milliseconds=ack_timeout_ms))
    offset = 0
    while True:
        page = list(await conn.execute(query.offset(offset)))
        claim, tried = await _claim_first_takeable(conn, agent, page, terms)
        if claim is not None or len(page) < CANDIDATES:
            return claim
        offset += len(page) - tried


@dataclass(frozen=True)
class _ClaimTerms:
    """What a claim writes on the row it takes, besides its attempt."""

    owner: str
    agent_id: str
    now: datetime
    ack_deadline: datetime


async def _claim_first_takeable(
    conn: AsyncConnection, agent: AgentSlot, candidates: Sequence[Any], terms: _ClaimTerms
) -> tuple[Claim | None, int]:
    """The first of `candidates` (job id, run id, runs_on, attempts) this agent can take, claimed; and how
    many rows it tried and left claimed because their job would not move to `dispatched`."""
    tried = 0
    for job_id, run_id, runs_on, attempts in candidates:
        # On PostgreSQL the exact matchers pre-filtered in SQL; the full match (globs, excludes, mandatory
        # labels) decides.
        if not agent_can_take(runs_on, agent):
            continue
        if await _mark_claimed(conn, job_id, attempts + 1, terms):
            return Claim(job_id, run_id, attempts + 1), tried
        tried += 1
    return None, tried


async def _mark_claimed(conn: AsyncConnection, job_id: str, attempt: int, terms: _ClaimTerms) -> bool:
    """The queue row claimed and its job moved to `dispatched` (guarded); whether the job moved."""
    if sql.hand_written(conn):
        dispatched = await fetch_one(
            conn,
            sql.CLAIM_ROW,
            {
                "owner": terms.owner,
                "agent": terms.agent_id,
                "attempt": attempt,
                "now": terms.now,
                "ack_deadline": terms.ack_deadline,
                "job_id": job_id,
                "sources": _DISPATCHED_FROM,
            },
        )
        if dispatched is None:
            await unchanged(conn, "job", job_id, "dispatched")
        return dispatched is not None
    await conn.execute(
        update(dispatch_queue)
        .where(dispatch_queue.c.job_id == job_id, dispatch_queue.c.state == "pending")
        .values(
            state="claimed",
            owner_instance_id=terms.owner,
            agent_id=terms.agent_id,
            attempts=attempt,
            claimed_at=terms.now,
            ack_deadline=terms.ack_deadline,
            unschedulable=None,
            unschedulable_since=None,
        )
    )
    applied = await transition(
        conn, "job", job_id, "dispatched", agent_id=terms.agent_id, instance_id=terms.owner
    )
    return applied == "changed"


# PostgreSQL's claim, hand-written (`sql.CLAIM_CANDIDATES`, `sql.CLAIM_ROW`): the candidates, locked; then
# the row claimed and its job dispatched by one statement.
_DISPATCHED_FROM = list(guard_sources("job", "dispatched"))


async def _claim_on_postgresql(
    conn: AsyncConnection,
    agent: AgentSlot,
    *,
    owner: str,
    now: datetime,
    ack_timeout_ms: int,
    bound_job_id: str | None,
) -> Claim | None:
    params: dict[str, Any] = {"now": now, "labels": Jsonb(claim_labels(agent))}
    if bound_job_id is not None:
        params["bound"] = bound_job_id
    bound, remote = bound_job_id is not None, agent.remote
    terms = _ClaimTerms(owner, agent.agent_id, now, now + timedelta(milliseconds=ack_timeout_ms))
    # The best row alone first: the SQL pre-filter is almost always the whole match, and every candidate
    # locked is a row other claimers skip (and a lock the database writes) until this transaction ends.
    best = await fetch_all(conn, sql.claim_candidates(bound=bound, remote=remote, limit=1), params)
    if not best:
        return None
    claim, _ = await _claim_first_takeable(conn, agent, best, terms)
    if claim is None:  # that row was not for this agent after all: look a little further
        few = sql.claim_candidates(bound=bound, remote=remote, limit=CANDIDATES)
        claim, _ = await _claim_first_takeable(conn, agent, await fetch_all(conn, few, params), terms)
    return claim


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


async def set_job_token(conn: AsyncConnection, job_id: str, attempt: int, token_hash: str) -> bool:
    """Give the claim `attempt` of a job the artifact credential whose SHA-256 is `token_hash`
    (docs/design/artifacts.md §4): it replaces an earlier claim's, which is then refused."""
    result = await conn.execute(
        update(dispatch_queue)
        .where(dispatch_queue.c.job_id == job_id, dispatch_queue.c.attempts == attempt)
        .values(job_token_hash=token_hash)
    )
    return bool(result.rowcount)


async def job_of_token(conn: AsyncConnection, token_hash: str) -> str | None:
    """The job whose current dispatch holds this credential (None once the job ended or was claimed again)."""
    row = await conn.execute(
        select(dispatch_queue.c.job_id).where(dispatch_queue.c.job_token_hash == token_hash)
    )
    return row.scalar_one_or_none()
