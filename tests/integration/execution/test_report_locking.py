"""Status report rows of one commit are written in one order, so job transitions never deadlock.

Every run on one SHA shares the rows of its contexts: a job starting writes the workflow's row and
then the job's, a job ending writes the job's and then the workflow's. Before the per-commit lock,
two such transactions deadlocked on PostgreSQL and the agent connection applying one of them was
closed (found by the two-coordinator acceptance test).
"""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import select

from conveyor.db.engine import Database
from conveyor.db.tables import status_reports
from conveyor.execution.reports import upsert_report
from tests.support.postgres import someone_waits_on_a_lock
from tests.support.waiting import async_wait_until

pytestmark = pytest.mark.postgres_only

SHA = "a" * 40


async def write(conn: object, context: str, status: str) -> None:
    await upsert_report(
        conn,  # type: ignore[arg-type]
        source_id="src",
        sha=SHA,
        context=context,
        run_id="run",
        job_id=None,
        status=status,
        target_url=None,
    )


async def test_opposite_write_orders_on_one_commit_queue_instead_of_deadlocking(
    pg_database: Database,
) -> None:
    db = pg_database
    second_started = asyncio.Event()

    async def job_ending() -> None:
        async with db.transaction() as conn:
            second_started.set()
            await write(conn, "conveyor/ci/build", "success")
            await write(conn, "conveyor/ci", "success")

    async with db.transaction() as first:
        await write(first, "conveyor/ci", "running")
        other = asyncio.create_task(job_ending())
        await second_started.wait()

        await async_wait_until(
            lambda: someone_waits_on_a_lock(db), timeout=30, what="the second writer to wait for the first"
        )
        await write(first, "conveyor/ci/build", "running")
    await asyncio.wait_for(other, timeout=30)  # raises DeadlockDetected without the lock

    async with db.read() as conn:
        rows = {r.context: (r.state, r.version) for r in await conn.execute(select(status_reports))}
    # Both transactions committed, the second last.
    assert rows == {"conveyor/ci": ("success", 2), "conveyor/ci/build": ("success", 2)}
