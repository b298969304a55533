"""Giving a claim back is conditional: a late decision never requeues a job that moved on.

The ack-timeout sweep, a reject, a disconnect and the stale-heartbeat sweep all decide from rows they
read earlier; by the time they requeue, the agent may have acked or started the job, or the row may be
another agent's claim. Requeuing then would hand one job out twice.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select, update

from conveyor.db.engine import Database
from conveyor.db.tables import dispatch_history, dispatch_queue, jobs
from conveyor.execution.lifecycle import Effects, start_job
from conveyor.execution.queue import AgentSlot, Claim, claim_for, requeue
from conveyor.model.ids import utc_now
from tests.support.queued import queue_job

AGENT_A = AgentSlot("agent-a", ("linux",), ())


async def claimed_job(database: Database, *, ack_timeout_ms: int) -> Claim:
    job_id = await queue_job(database, "linux")
    async with database.transaction() as conn:
        claim = await claim_for(conn, AGENT_A, owner="node", now=utc_now(), ack_timeout_ms=ack_timeout_ms)
    assert claim is not None and claim.job_id == job_id
    return claim


async def state_of(database: Database, job_id: str) -> tuple[str, str, list[str]]:
    async with database.read() as conn:
        queue_state = (
            await conn.execute(select(dispatch_queue.c.state).where(dispatch_queue.c.job_id == job_id))
        ).scalar_one()
        job_status = (await conn.execute(select(jobs.c.status).where(jobs.c.id == job_id))).scalar_one()
        outcomes = list(
            (
                await conn.execute(
                    select(dispatch_history.c.outcome).where(dispatch_history.c.job_id == job_id)
                )
            ).scalars()
        )
    return queue_state, job_status, outcomes


async def give_back(database: Database, job_id: str, outcome: str, **conditions: Any) -> Effects | None:
    """`requeue` in its own transaction, as each caller runs it."""
    async with database.transaction() as conn:
        return await requeue(
            conn, job_id, outcome=outcome, detail=None, now=utc_now(), max_attempts=3, **conditions
        )


async def test_an_overdue_claim_is_given_back_once(database: Database) -> None:
    claim = await claimed_job(database, ack_timeout_ms=-1000)
    late = {"agent_id": AGENT_A.agent_id, "attempt": claim.attempt, "ack_due_before": utc_now()}
    assert await give_back(database, claim.job_id, "ack_timeout", **late) is not None
    # A second sweep that read the same overdue row finds nothing left to give back.
    assert await give_back(database, claim.job_id, "ack_timeout", **late) is None
    assert await state_of(database, claim.job_id) == ("pending", "queued", ["ack_timeout"])


async def test_an_ack_that_lands_after_the_sweep_read_keeps_the_job(database: Database) -> None:
    claim = await claimed_job(database, ack_timeout_ms=-1000)
    read_at = utc_now()  # the sweep saw the deadline passed…
    async with database.transaction() as conn:  # …then the ack is applied, as the hub does
        await conn.execute(
            update(dispatch_queue).where(dispatch_queue.c.job_id == claim.job_id).values(ack_deadline=None)
        )
    late = {"agent_id": AGENT_A.agent_id, "attempt": claim.attempt, "ack_due_before": read_at}
    assert await give_back(database, claim.job_id, "ack_timeout", **late) is None
    assert await state_of(database, claim.job_id) == ("claimed", "dispatched", [])


async def test_a_started_job_or_another_agents_claim_is_not_given_back(database: Database) -> None:
    claim = await claimed_job(database, ack_timeout_ms=60_000)
    assert await give_back(database, claim.job_id, "rejected", agent_id="agent-b") is None
    earlier = {"agent_id": AGENT_A.agent_id, "attempt": claim.attempt - 1}
    assert await give_back(database, claim.job_id, "agent_lost", **earlier) is None
    assert await state_of(database, claim.job_id) == ("claimed", "dispatched", [])

    async with database.transaction() as conn:
        await start_job(conn, claim.job_id, AGENT_A.agent_id, utc_now())
    assert await give_back(database, claim.job_id, "agent_lost", agent_id=AGENT_A.agent_id) is None
    assert await state_of(database, claim.job_id) == ("started", "running", [])
