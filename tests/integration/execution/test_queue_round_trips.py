"""Claim + complete of a single-job run costs a bounded number of statements (issue 20, "queue").

Every statement is a round trip to the database plus, through SQLAlchemy, its async bridge, which is
what made Conveyor's claim+complete five times slower than the same work in hand-written SQL. These
bounds pin the merged reads and writes so they do not creep back: on SQLite `UPDATE … RETURNING` for
the job, `DELETE … RETURNING` for the queue row, the run row read by the statement that locks it, one
read of the run's jobs; on PostgreSQL the hand-written statements of `db/driver_sql.py`, which claim a
row and dispatch its job in one statement, and end a job (queue row, history, steps, timeline, and the
run's jobs read back) in one and its run (with its timeline) in another.

On PostgreSQL the statements are counted where every one of them passes, SQLAlchemy's and the
hand-written ones alike: psycopg's cursor.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest.mock import patch

import psycopg
from sqlalchemy import event, select

from conveyor.db.engine import Database
from conveyor.db.tables import dispatch_history, dispatch_queue, jobs, run_timeline, runs
from conveyor.execution.lifecycle import finish_job
from conveyor.execution.queue import AgentSlot, claim_for
from conveyor.model.ids import utc_now
from tests.support.queued import queue_job

AGENT = AgentSlot("agent-a", ("linux",), ())
# Statements the application sends (not SQLite's BEGIN IMMEDIATE nor the pool's ping of a connection).
CLAIM_STATEMENTS = {
    "sqlite": 3,  # candidates, queue row claimed, job dispatched
    "postgresql": 2,  # candidates locked; queue row claimed with its job dispatched
}
FINISH_STATEMENTS = {
    # run read, job ended, queue row removed, history, open steps, timeline, the run's jobs, run ended,
    # timeline
    "sqlite": 9,
    # run locked and read, queue row locked, job ended with all that goes with it (and the run's jobs
    # read back), run ended with its timeline
    "postgresql": 4,
}
POOL_PING = ";"  # what SQLAlchemy sends to ping a PostgreSQL connection


@contextmanager
def counted(db: Database) -> Iterator[list[str]]:
    statements: list[str] = []
    if db.dialect == "postgresql":
        original = psycopg.AsyncCursor.execute

        async def execute(self: psycopg.AsyncCursor[Any], query: Any, *args: Any, **kwargs: Any) -> Any:
            text = query if isinstance(query, str) else str(query)
            if text.strip() != POOL_PING:
                statements.append(text)
            return await original(self, query, *args, **kwargs)

        with patch.object(psycopg.AsyncCursor, "execute", execute):
            yield statements
        return

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
    assert len(claiming) <= CLAIM_STATEMENTS[database.dialect], claiming
    assert len(finishing) <= FINISH_STATEMENTS[database.dialect], finishing
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
