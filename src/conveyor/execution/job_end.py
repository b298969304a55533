"""A job's end and its run's end as rows (docs/design/execution.md §4, §5): the run locked and read, the
job made terminal with what goes with it, the run concluded.

Every dispatched job runs these, so on PostgreSQL they are the hand-written statements of
`execution/sql.py` (run on the driver by `db/driver_sql.py`); each has its SQLAlchemy Core twin here,
which SQLite runs. What follows a job's end (dependants, groups, the run's conclusion) is `lifecycle`'s.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import case, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.db.driver_sql import Jsonb, fetch_all, fetch_one
from conveyor.db.tables import jobs, runs, sources, steps
from conveyor.execution import sql
from conveyor.execution.history import remove_queue_row, timeline
from conveyor.execution.logs import DispatchAttempt
from conveyor.execution.transitions import (
    Applied,
    after_change,
    guard_sources,
    transition,
    transition_returning,
    unchanged,
)
from conveyor.model.ids import new_id, utc_now


def run_report_column() -> Any:
    """The `report` a run's commit statuses follow: its source's, except `none` for a global workflow's run
    that is not required (docs/design/global_workflows.md §5); `sql.LOCK_RUN_FOR_FINISH`'s twin."""
    return case(
        ((runs.c.global_source.is_not(None)) & (runs.c.global_required.is_(False)), "none"),
        else_=sources.c.report,
    ).label("report")


async def lock_run_for_finish(conn: AsyncConnection, job_id: str) -> dict[str, Any] | None:
    """`lifecycle.lock_job_for_change` that also returns the run's columns a job's end needs
    (`sql.LOCK_RUN_FOR_FINISH_COLUMNS`).

    The run row is read by the statement that locks it (PostgreSQL; a plain read on SQLite, whose
    writer excludes every other), so finishing a job needs no second read of its run.
    """
    if sql.hand_written(conn):
        found = await fetch_one(conn, sql.LOCK_RUN_FOR_FINISH, {"job_id": job_id})
        await fetch_all(conn, sql.LOCK_QUEUE_ROW, {"job_id": job_id})
        return dict(zip(sql.LOCK_RUN_FOR_FINISH_COLUMNS, found, strict=True)) if found is not None else None
    query = (
        select(
            *(runs.c[name] for name in sql.LOCK_RUN_FOR_FINISH_COLUMNS[:-2]),
            case((runs.c.concurrency_key.is_not(None), runs.c.workflow_lock)).label("workflow_lock"),
            run_report_column(),
        )
        .outerjoin(sources, sources.c.id == runs.c.source_id)
        .where(runs.c.id == select(jobs.c.run_id).where(jobs.c.id == job_id).scalar_subquery())
    )
    row = (await conn.execute(query)).first()
    return dict(row._mapping) if row is not None else None


async def end_job(
    conn: AsyncConnection,
    job_id: str,
    status: str,
    reason: str | None,
    outputs: dict[str, Any] | None,
    queue_outcome: str,
    only_from: set[str] | None,
    counted_attempt: DispatchAttempt | None = None,
) -> tuple[Applied, dict[str, Any] | None, list[tuple[str, str]] | None]:
    """The job made terminal with what goes with it (queue row to history, open steps closed, timeline);
    the job's row when it changed, and on PostgreSQL its run's jobs' names and statuses after it."""
    now = utc_now()
    detail = {"status": status, "reason": reason}
    if sql.hand_written(conn):
        ended = await fetch_one(
            conn,
            sql.END_JOB,
            {
                "job_id": job_id,
                "status": status,
                "reason": reason,
                "outputs": Jsonb(outputs) if outputs is not None else None,
                "now": now,
                "sources": list(guard_sources("job", status, only_from)),
                "history_id": new_id(),
                "outcome": queue_outcome,
                "timeline_id": new_id(),
                "detail": Jsonb(detail),
                "log_attempt": counted_attempt.attempt if counted_attempt else None,
                "log_hop": counted_attempt.hop if counted_attempt else None,
            },
        )
        if ended is None:
            return await unchanged(conn, "job", job_id, status), None, None
        await after_change(conn, "job", job_id, status)
        *row, run_jobs = ended
        return (
            "changed",
            dict(zip(sql.END_JOB_COLUMNS, row, strict=True)),
            [(name, s) for name, s in run_jobs],
        )
    counted = (
        {"log_attempt": counted_attempt.attempt, "log_hop": counted_attempt.hop} if counted_attempt else {}
    )
    applied, job = await transition_returning(
        conn,
        "job",
        job_id,
        status,
        only_from=only_from,
        reason=reason,
        outputs=outputs,
        finished_at=now,
        **counted,
    )
    if applied != "changed":
        return applied, None, None
    assert job is not None
    await remove_queue_row(conn, job_id, queue_outcome, reason)
    # Steps still open when their job ends are closed `cancelled`.
    await conn.execute(
        update(steps)
        .where(steps.c.job_id == job_id, steps.c.status == "running")
        .values(status="cancelled", finished_at=now)
    )
    await timeline(conn, job["run_id"], job_id, "agent", "job.finished", detail)
    return applied, job, None


async def job_statuses_of_run(conn: AsyncConnection, run_id: str) -> list[tuple[str, str]]:
    """Every job of a run: its name and status."""
    if sql.hand_written(conn):
        return [
            (name, status)
            for name, status in await fetch_all(conn, sql.JOB_STATUSES_OF_RUN, {"run_id": run_id})
        ]
    return [
        (r.name, r.status)
        for r in await conn.execute(select(jobs.c.name, jobs.c.status).where(jobs.c.run_id == run_id))
    ]


async def end_run(conn: AsyncConnection, run_id: str, conclusion: str) -> Applied:
    """The run made terminal (`conclusion`), with its `run.finished` timeline entry."""
    detail = {"status": conclusion}
    if not sql.hand_written(conn):
        applied = await transition(conn, "run", run_id, conclusion, finished_at=utc_now())
        if applied == "changed":
            await timeline(conn, run_id, None, "dispatch", "run.finished", detail)
        return applied
    parameters = {
        "run_id": run_id,
        "status": conclusion,
        "now": utc_now(),
        "sources": list(guard_sources("run", conclusion)),
        "timeline_id": new_id(),
        "detail": Jsonb(detail),
    }
    if await fetch_one(conn, sql.END_RUN, parameters) is None:
        return await unchanged(conn, "run", run_id, conclusion)
    await after_change(conn, "run", run_id, conclusion)
    return "changed"
