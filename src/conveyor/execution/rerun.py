"""Re-runs (docs/design/execution.md §8.5, docs/design/admin.md §4): a new run from an old run's stored event
and lock.

Same SHA, no fetch, no matching. With `failed_only`, the parent's successful jobs are created
`success` with their outputs, artifacts and test reports copied, so only the others run again and can
still download what the copied jobs uploaded (docs/design/artifacts.md §1).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import insert, select
from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.blobs import store as blob_rows
from conveyor.db.tables import artifacts, jobs, runs, test_reports
from conveyor.errors import ConveyorError
from conveyor.execution.creation import CreatedRun, RunOrigin, create_run
from conveyor.execution.lifecycle import _report as report_status
from conveyor.lockfile import WorkflowEntry
from conveyor.matching import Event
from conveyor.model.ids import new_id, utc_now
from conveyor.model.states import RUN_TERMINAL


class NotRerunnable(ConveyorError):
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
    conn: AsyncConnection,
    parent_id: str,
    *,
    failed_only: bool,
    requested_by: str | None,
    triggered_by: str | None = None,
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
        triggered_by=triggered_by,
        # A global workflow's re-run is one too: same name, same policy checkout, same status rule
        # (docs/design/global_workflows.md §5).
        global_source=parent.global_source,
        global_required=bool(parent.global_required),
    )
    copied = copied_jobs(parent_jobs, failed_only=failed_only)
    trace: dict[str, Any] = {
        "rerun": {"parent_run_id": parent_id, "failed_only": failed_only, "by": requested_by}
    }
    if parent.global_source and isinstance(parent.trigger_trace, dict) and "global" in parent.trigger_trace:
        trace["global"] = parent.trigger_trace["global"]
    created = await create_run(
        conn,
        origin=origin,
        workflow=WorkflowEntry.model_validate(parent.workflow_lock),
        event=Event.model_validate(parent.event),
        trigger_trace=trace,
        copied=copied,
    )
    assert created is not None  # no delivery or event id: never a duplicate
    if copied:
        await _carry_artifacts(conn, parent_jobs, created.id, set(copied), utc_now())
    status = (await conn.execute(select(runs.c.status).where(runs.c.id == created.id))).scalar_one()
    await report_status(conn, created.id, None, status)
    return created


async def _carry_artifacts(
    conn: AsyncConnection,
    parent_jobs: list[dict[str, Any]],
    run_id: str,
    copied: set[tuple[str, str]],
    now: datetime,
) -> None:
    """Give the copied jobs of run `run_id` the artifacts and test reports their parent jobs left.

    The rows are copied, the bytes are not: each new row names the same blob, locked live as a commit
    locks it, so a sweep deleting that blob right now makes the artifact absent rather than dangling.
    An artifact already expired is not carried.
    """
    new_rows = await conn.execute(
        select(jobs.c.id, jobs.c.name, jobs.c.matrix_key).where(jobs.c.run_id == run_id)
    )
    new_by_key = {(row.name, row.matrix_key or ""): row.id for row in new_rows}
    job_map = {
        job["id"]: new_by_key[key]
        for job in parent_jobs
        if (key := (job["name"], job["matrix_key"] or "")) in copied and key in new_by_key
    }
    if not job_map:
        return
    parent_id = parent_jobs[0]["run_id"]
    carried: dict[str, str] = {}
    listed = await conn.execute(
        select(artifacts)
        .where(artifacts.c.run_id == parent_id, artifacts.c.job_id.in_(list(job_map)))
        .order_by(artifacts.c.created_at, artifacts.c.id)
    )
    for row in [dict(r._mapping) for r in listed]:
        if row["expires_at"] is not None and row["expires_at"] <= now:
            continue
        if not await blob_rows.lock_live(conn, row["blob_sha256"]):
            continue
        carried[row["id"]] = new_id()
        await conn.execute(
            insert(artifacts).values(
                **{**row, "id": carried[row["id"]], "run_id": run_id, "job_id": job_map[row["job_id"]]}
            )
        )
    reports = await conn.execute(
        select(test_reports).where(
            test_reports.c.run_id == parent_id, test_reports.c.job_id.in_(list(job_map))
        )
    )
    for report in [dict(r._mapping) for r in reports]:
        await conn.execute(
            insert(test_reports).values(
                **{
                    **report,
                    "id": new_id(),
                    "run_id": run_id,
                    "job_id": job_map[report["job_id"]],
                    "artifact_id": carried.get(report["artifact_id"] or ""),
                }
            )
        )
