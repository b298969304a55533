"""Hand-written statements on psycopg (`db/driver_sql.py`) belong to the SQLAlchemy transaction they run in.

The queue's claim and a job's end run on the driver connection under a `Database.transaction()`; if they
were outside it, a rollback would leave a job dispatched without its queue row claimed, or a deadlock
would surface as a bare psycopg error the retry loops do not recognise.
"""

from __future__ import annotations

import pytest
from sqlalchemy import select, text
from sqlalchemy.exc import DBAPIError, IntegrityError

from conveyor.db.driver_sql import Jsonb, fetch_all, fetch_one
from conveyor.db.engine import Database, is_transient
from conveyor.db.tables import run_timeline
from conveyor.model.ids import new_id, utc_now
from tests.support.queued import insert_queued_run


class Boom(Exception):
    pass


async def _add_run(database: Database) -> str:
    run_id = new_id()
    async with database.transaction() as conn:
        await insert_queued_run(conn, run_id)
    return run_id


_NOTE = """
INSERT INTO run_timeline (id, run_id, job_id, at, source, kind, detail)
VALUES (%(id)s, %(run_id)s, NULL, %(at)s, 'dispatch', 'note', %(detail)s)
RETURNING id
"""


async def _notes(database: Database) -> list[tuple[str, object]]:
    async with database.read() as conn:
        return [
            (r.kind, r.detail) for r in await conn.execute(select(run_timeline.c.kind, run_timeline.c.detail))
        ]


async def test_a_statement_commits_with_the_transaction_it_ran_in_and_reads_what_it_wrote(
    pg_database: Database,
) -> None:
    run_id = await _add_run(pg_database)
    async with pg_database.transaction() as conn:
        await conn.execute(text("UPDATE runs SET status = 'running' WHERE id = :id"), {"id": run_id})
        # The hand-written read sees the SQLAlchemy write before either commits: one transaction.
        assert await fetch_one(conn, "SELECT status FROM runs WHERE id = %(id)s", {"id": run_id}) == (
            "running",
        )
        written = await fetch_all(
            conn, _NOTE, {"id": new_id(), "run_id": run_id, "at": utc_now(), "detail": Jsonb({"n": 1})}
        )
        assert len(written) == 1
    assert await _notes(pg_database) == [("note", {"n": 1})]


async def test_a_statement_is_rolled_back_with_the_transaction_it_ran_in(pg_database: Database) -> None:
    run_id = await _add_run(pg_database)
    with pytest.raises(Boom):
        async with pg_database.transaction() as conn:
            await fetch_all(conn, _NOTE, {"id": new_id(), "run_id": run_id, "at": utc_now(), "detail": None})
            raise Boom
    assert await _notes(pg_database) == []


async def test_errors_are_sqlalchemys_and_a_lock_timeout_reads_as_transient(pg_database: Database) -> None:
    run_id = await _add_run(pg_database)
    with pytest.raises(IntegrityError):  # the subclass SQLAlchemy itself raises for a unique violation
        async with pg_database.transaction() as conn:
            await fetch_all(
                conn,
                "INSERT INTO runs (id, org_id, number, workflow, repo, event, status, created_at) "
                "SELECT id, org_id, number, workflow, repo, event, status, created_at FROM runs WHERE id = %(id)s",
                {"id": run_id},
            )
    async with pg_database.transaction() as holder:
        await holder.execute(text("SELECT id FROM runs WHERE id = :id FOR UPDATE"), {"id": run_id})
        with pytest.raises(DBAPIError) as raised:
            async with pg_database.transaction() as conn:
                await conn.execute(text("SET LOCAL lock_timeout = '50ms'"))
                await fetch_one(conn, "SELECT id FROM runs WHERE id = %(id)s FOR UPDATE", {"id": run_id})
        assert is_transient(raised.value)
    # The pool's connection came back usable after the failed transactions.
    async with pg_database.transaction() as conn:
        assert await fetch_one(conn, "SELECT count(*) FROM runs", {}) == (1,)
