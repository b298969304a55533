"""Re-runs (docs/design/execution.md §8.5, docs/design/admin.md §4): a new run from an old run's stored event
and lock.

Same SHA, no fetch, no matching. With `failed_only`, the parent's successful jobs are created
`success` with their outputs copied, so only the others run again.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.db.tables import jobs, runs
from conveyor.execution.creation import CreatedRun, RunOrigin, create_run
from conveyor.execution.lifecycle import _report as report_status
from conveyor.lockfile import WorkflowEntry
from conveyor.matching import Event
from conveyor.model.states import RUN_TERMINAL


class NotRerunnable(Exception):
    """The run cannot be re-run (still active, or it has no stored workflow lock): 409 `conflict`."""


def copied_jobs(parent_jobs: list[dict[str, Any]], *, failed_only: bool) -> dict[tuple[str, str], Any] | None:
    """`(job, matrix_key) → outputs` of the parent's successful jobs to copy (pure); None copies nothing."""
    if not failed_only:
        return None
    return {
        (job["name"], job["matrix_key"] or ""): job["outputs"]
        for job in parent_jobs
        if job["status"] == "success"
    }


async def rerun(
    conn: AsyncConnection, parent_id: str, *, failed_only: bool, requested_by: str | None
) -> CreatedRun:
    """Create the new run in the caller's transaction; raise `LookupError` for an unknown parent."""
    parent = (await conn.execute(select(runs).where(runs.c.id == parent_id))).first()
    if parent is None:
        raise LookupError(parent_id)
    if parent.status not in RUN_TERMINAL:
        raise NotRerunnable(f"run {parent_id} is still {parent.status}; cancel it or wait for it to end")
    if not parent.workflow_lock:
        raise NotRerunnable(
            f"run {parent_id} has no workflow lock to run again ({parent.reason or parent.status})"
        )
    parent_jobs = [
        dict(r._mapping) for r in await conn.execute(select(jobs).where(jobs.c.run_id == parent_id))
    ]
    origin = RunOrigin(
        org_id=parent.org_id,
        source_id=parent.source_id,
        routing_key=parent.routing_key,
        registration_id=None,
        chain_depth=parent.chain_depth,
        parent_run_id=parent_id,
    )
    created = await create_run(
        conn,
        origin=origin,
        workflow=WorkflowEntry.model_validate(parent.workflow_lock),
        event=Event.model_validate(parent.event),
        trigger_trace={"rerun": {"parent_run_id": parent_id, "failed_only": failed_only, "by": requested_by}},
        copied=copied_jobs(parent_jobs, failed_only=failed_only),
    )
    assert created is not None  # no delivery or event id: never a duplicate
    status = (await conn.execute(select(runs.c.status).where(runs.c.id == created.id))).scalar_one()
    await report_status(conn, created.id, None, status)
    return created
