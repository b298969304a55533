"""A commit's status row follows the newest run on it: an older run's late transition leaves it alone."""

from __future__ import annotations

from sqlalchemy import select

from conveyor.db.engine import Database
from conveyor.db.tables import status_reports
from conveyor.execution.reports import upsert_report
from conveyor.model.ids import new_id

SHA = "b" * 40
CONTEXT = "conveyor/ci"


async def write(database: Database, run_id: str, status: str) -> None:
    async with database.transaction() as conn:
        await upsert_report(
            conn,
            source_id="src",
            sha=SHA,
            context=CONTEXT,
            run_id=run_id,
            job_id=None,
            status=status,
            target_url=None,
        )


async def row(database: Database) -> tuple[str, str, int]:
    async with database.read() as conn:
        found = (await conn.execute(select(status_reports))).one()
    return found.run_id, found.state, found.version


async def test_an_older_run_does_not_overwrite_a_newer_runs_status(database: Database) -> None:
    older, newer = new_id(), new_id()
    await write(database, older, "running")
    await write(database, newer, "queued")
    assert await row(database) == (newer, "pending", 2)
    # The older run is cancelled (superseded) after the newer one wrote: the row keeps the newer run.
    await write(database, older, "cancelled")
    assert await row(database) == (newer, "pending", 2)
    # The newer run's own transitions still go through, and so does a re-run (a newer id again).
    await write(database, newer, "success")
    assert await row(database) == (newer, "success", 3)
    rerun = new_id()
    await write(database, rerun, "queued")
    assert await row(database) == (rerun, "pending", 4)
