"""A cancel racing a claim queues behind it instead of deadlocking (PostgreSQL row locks).

The dispatcher's claim locks the queue row, then writes the job. A cancel used to write the job
first and delete the queue row second, so the two deadlocked and the cancel answered 503 (found by
the events suite in CI). Every job change now locks the run row, then the queue row, then the job.
"""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import select

from conveyor.db.engine import Database
from conveyor.db.tables import dispatch_queue, jobs
from conveyor.execution.cancel import cancel_run
from conveyor.execution.lifecycle import CancelOutcome
from conveyor.execution.queue import AgentSlot, claim_for
from conveyor.model.ids import utc_now
from tests.support.postgres import someone_waits_on_a_lock
from tests.support.queued import queue_job
from tests.support.waiting import async_wait_until

pytestmark = pytest.mark.postgres_only

AGENT = AgentSlot("agent-a", ("linux",), ())


async def test_a_cancel_during_a_claim_waits_for_it_and_then_signals_the_agent(pg_database: Database) -> None:
    db = pg_database
    job_id = await queue_job(db, "linux")
    async with db.read() as conn:
        run_id = (await conn.execute(select(jobs.c.run_id).where(jobs.c.id == job_id))).scalar_one()

    async def cancel() -> CancelOutcome:
        async with db.transaction() as conn:
            return await cancel_run(conn, run_id, reason="cancelled_by: test", force=False, cancelled_by="t")

    async with db.transaction() as claimer:
        # The claim's first statement: the candidate queue row, locked.
        locked = await claimer.execute(
            select(dispatch_queue.c.job_id)
            .where(dispatch_queue.c.job_id == job_id)
            .with_for_update(skip_locked=True)
        )
        assert locked.scalar_one() == job_id
        cancelling = asyncio.create_task(cancel())
        await async_wait_until(
            lambda: someone_waits_on_a_lock(db), timeout=30, what="the cancel to wait for the claim"
        )
        claim = await claim_for(claimer, AGENT, owner="node", now=utc_now(), ack_timeout_ms=60_000)
        assert claim is not None and claim.job_id == job_id
    outcome = await asyncio.wait_for(cancelling, timeout=30)  # raised DeadlockDetected before the fix

    # The cancel saw the committed claim: the agent is told, the claim stands until it answers.
    assert (outcome.cancelled, outcome.signalled) == (0, 1)
    async with db.read() as conn:
        status = (await conn.execute(select(jobs.c.status).where(jobs.c.id == job_id))).scalar_one()
        state = (
            await conn.execute(select(dispatch_queue.c.state).where(dispatch_queue.c.job_id == job_id))
        ).scalar_one()
    assert (status, state) == ("cancelling", "claimed")
