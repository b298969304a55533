"""Claim + complete of a single-job run costs a bounded number of statements (issue 20, "queue").

Every statement is a round trip to the database plus SQLAlchemy's async bridge, which is what made
Conveyor's claim+complete five times slower than the same work in hand-written SQL. These bounds pin
the merged reads (`UPDATE … RETURNING` for the job, `DELETE … RETURNING` for the queue row, the run row
read by the statement that locks it, one read of the run's jobs) so they do not creep back.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import event, select

from conveyor.db.engine import Database
from conveyor.db.tables import dispatch_history, dispatch_queue, jobs, run_timeline, runs
from conveyor.execution.lifecycle import finish_job
from conveyor.execution.queue import AgentSlot, claim_for
from conveyor.model.ids import utc_now
from tests.support.queued import queue_job

AGENT = AgentSlot("agent-a", ("linux",), ())
# Statements the application sends (BEGIN IMMEDIATE, SQLite's only explicit one, is not counted).
CLAIM_STATEMENTS = 3  # candidates, queue row claimed, job dispatched
FINISH_STATEMENTS = 10  # run read under its lock (+ queue row lock on PostgreSQL), job, queue row, history,
# open steps, timeline, the run's jobs, run concluded, timeline


@contextmanager
def counted(db: Database) -> Iterator[list[str]]:
    statements: list[str] = []

    def record(_conn: object, _cursor: object, statement: str, *_rest: object) -> None:
        if not statement.startswith("BEGIN"):
            statements.append(statement)

    event.listen(db.engine.sync_engine, "before_cursor_execute", record)
    try:
        yield statements
    finally:
        event.remove(db.engine.sync_engine, "before_cursor_execute", record)


async def test_claim_and_complete_of_a_single_job_run_stay_within_their_statement_budget(
    database: Database,
) -> None:
    job_id = await queue_job(database, "linux")

    with counted(database) as claiming:
        async with database.transaction() as conn:
            claim = await claim_for(conn, AGENT, owner="node", now=utc_now(), ack_timeout_ms=60_000)
    with counted(database) as finishing:
        async with database.transaction() as conn:
            effects = await finish_job(conn, job_id, "success")

    assert claim is not None and claim.job_id == job_id
    assert len(claiming) <= CLAIM_STATEMENTS, claiming
    assert len(finishing) <= FINISH_STATEMENTS + (1 if database.dialect == "postgresql" else 0), finishing
    # … and the work is all done: job and run concluded, queue row moved to history, timeline written.
    async with database.read() as conn:
        job = (await conn.execute(select(jobs.c.status, jobs.c.run_id).where(jobs.c.id == job_id))).one()
        run_status = (await conn.execute(select(runs.c.status).where(runs.c.id == job.run_id))).scalar_one()
        queued = (await conn.execute(select(dispatch_queue.c.job_id))).all()
        history = (await conn.execute(select(dispatch_history.c.outcome))).scalars().all()
        kinds = (await conn.execute(select(run_timeline.c.kind))).scalars().all()
    assert (job.status, run_status) == ("success", "success")
    assert effects.finished_runs == [job.run_id]
    assert queued == [] and history == ["finished"]
    assert sorted(kinds) == ["job.finished", "run.finished"]
