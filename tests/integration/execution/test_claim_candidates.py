"""Which queue rows a claim looks at and locks (`execution/queue.py`).

The SQL pre-filter knows only exact labels; globs, excludes and mandatory labels are decided after. A
claim takes the best row alone first, and looks further only when that row is not for this agent, so a
claim on PostgreSQL leaves every other pending row free for concurrent claimers.
"""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select, text, update

from conveyor.db.engine import Database
from conveyor.db.tables import dispatch_queue, jobs
from conveyor.execution.queue import CANDIDATES, AgentSlot, claim_for
from conveyor.model.ids import utc_now
from tests.support.queued import queue_job

GPU_AGENT = AgentSlot("agent-gpu", ("gpu", "linux"), ())


async def _age(db: Database, job_id: str, seconds: int) -> None:
    async with db.transaction() as conn:
        await conn.execute(
            update(dispatch_queue)
            .where(dispatch_queue.c.job_id == job_id)
            .values(enqueued_at=utc_now() - timedelta(seconds=seconds))
        )


async def test_a_claim_passes_over_the_oldest_row_when_it_excludes_the_agent(database: Database) -> None:
    not_on_gpu = await queue_job(database, "linux", exclude=("gpu",))
    any_linux = await queue_job(database, "linux")
    await _age(database, not_on_gpu, 20)
    await _age(database, any_linux, 10)

    async with database.transaction() as conn:
        claim = await claim_for(conn, GPU_AGENT, owner="node", now=utc_now(), ack_timeout_ms=60_000)

    assert claim is not None and claim.job_id == any_linux
    async with database.read() as conn:
        states = dict((await conn.execute(select(dispatch_queue.c.job_id, dispatch_queue.c.state))).all())
        statuses = dict((await conn.execute(select(jobs.c.id, jobs.c.status))).all())
    assert states == {not_on_gpu: "pending", any_linux: "claimed"}
    assert statuses == {not_on_gpu: "queued", any_linux: "dispatched"}


async def test_a_claim_finds_nothing_when_no_row_is_for_the_agent(database: Database) -> None:
    await queue_job(database, "linux", exclude=("gpu",))
    async with database.transaction() as conn:
        assert await claim_for(conn, GPU_AGENT, owner="node", now=utc_now(), ack_timeout_ms=60_000) is None


async def test_a_claim_on_postgresql_locks_only_the_row_it_takes(pg_database: Database) -> None:
    queued = [await queue_job(pg_database, "linux") for _ in range(5)]
    for age, job_id in enumerate(reversed(queued)):
        await _age(pg_database, job_id, age + 1)

    async with pg_database.transaction() as conn:
        claim = await claim_for(conn, GPU_AGENT, owner="node", now=utc_now(), ack_timeout_ms=60_000)
        assert claim is not None and claim.job_id == queued[0]
        # While the claim's transaction is open, a concurrent claimer can lock every other row.
        async with pg_database.transaction() as other:
            free = (
                await other.execute(
                    text("SELECT job_id FROM dispatch_queue ORDER BY enqueued_at FOR UPDATE SKIP LOCKED")
                )
            ).scalars()
            assert list(free) == queued[1:]


async def test_a_claim_looks_past_a_page_of_rows_not_for_the_agent(database: Database) -> None:
    """SQLite reads the queue a page (`CANDIDATES` rows) at a time and still considers every pending row;
    PostgreSQL looks at the best `CANDIDATES` rows only (docs/design/execution.md §5), locked."""
    not_on_gpu = [await queue_job(database, "linux", exclude=("gpu",)) for _ in range(CANDIDATES + 4)]
    any_linux = await queue_job(database, "linux")
    for age, job_id in enumerate(reversed([*not_on_gpu, any_linux])):
        await _age(database, job_id, age + 1)

    async with database.transaction() as conn:
        claim = await claim_for(conn, GPU_AGENT, owner="node", now=utc_now(), ack_timeout_ms=60_000)

    if database.dialect == "sqlite":
        assert claim is not None and claim.job_id == any_linux
    else:
        assert claim is None
    async with database.read() as conn:
        pending = (
            await conn.execute(select(dispatch_queue.c.job_id).where(dispatch_queue.c.state == "pending"))
        ).scalars()
        assert set(pending) == set(not_on_gpu) | ({any_linux} if claim is None else set())
