"""Deleting ended runs past `run_retention_days`, with everything hanging off them
(docs/design/execution.md §3).

The sweep works in bounded batches: each call deletes at most `batch` log rows, or finishes up to
`batch` runs, in the caller's (short, fenced) transaction, so a large backlog never holds one long
transaction or keeps ingest from writing. A run is deleted last, after its children, so a batch cut
short by a crash or a lost lease is simply found again by the next sweep.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, Table, and_, delete, select, tuple_
from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.db.tables import (
    dispatch_history,
    job_logs,
    job_needs,
    jobs,
    run_timeline,
    runs,
    status_reports,
    steps,
)
from conveyor.model.states import JOB_TERMINAL, RUN_TERMINAL


def retention_cutoff(now: datetime, days: int) -> datetime | None:
    """Rows older than this are past retention; None when `days` is 0 (keep forever)."""
    if days <= 0:
        return None
    return now - timedelta(days=days)


@dataclass(frozen=True)
class RunCursor:
    """Where the last batch of one sweep stopped (keyset on `runs (created_at, id)`)."""

    created_at: datetime
    id: str


async def expired_runs(
    conn: AsyncConnection, cutoff: datetime, limit: int, after: RunCursor | None = None
) -> list[RunCursor]:
    """Up to `limit` ended runs whose `finished_at` is before `cutoff`, oldest first.

    A run that has not ended is never returned, however old. A run ends after it was created, so
    `created_at < cutoff` holds for every expired run and lets the `(created_at, id)` index bound
    the scan.
    """
    query = (
        select(runs.c.created_at, runs.c.id)
        .where(
            runs.c.created_at < cutoff,
            runs.c.status.in_(sorted(RUN_TERMINAL)),
            runs.c.finished_at.is_not(None),
            runs.c.finished_at < cutoff,
            # A job still active under an ended run (never expected) keeps the run.
            ~select(jobs.c.id)
            .where(jobs.c.run_id == runs.c.id, jobs.c.status.not_in(sorted(JOB_TERMINAL)))
            .exists(),
        )
        .order_by(runs.c.created_at, runs.c.id)
        .limit(limit)
    )
    if after is not None:
        query = query.where(tuple_(runs.c.created_at, runs.c.id) > tuple_(after.created_at, after.id))
    return [RunCursor(row.created_at, row.id) for row in await conn.execute(query)]


async def delete_runs(
    conn: AsyncConnection, run_ids: Sequence[str], batch: int
) -> tuple[dict[str, int], bool]:
    """Delete the runs' rows, leaf tables first; return the counts per table and whether it finished.

    At most `batch` log rows go per call: when more remain, the call stops there (unfinished) and
    the caller commits and calls again, so a run with a huge log never makes one long transaction.
    """
    counts: dict[str, int] = {}
    if not run_ids:
        return counts, True
    job_ids = [row.id for row in await conn.execute(select(jobs.c.id).where(jobs.c.run_id.in_(run_ids)))]
    if job_ids:
        key = tuple_(
            job_logs.c.job_id, job_logs.c.attempt, job_logs.c.hop, job_logs.c.step_index, job_logs.c.seq
        )
        some_logs = (
            select(
                job_logs.c.job_id, job_logs.c.attempt, job_logs.c.hop, job_logs.c.step_index, job_logs.c.seq
            )
            .where(job_logs.c.job_id.in_(job_ids))
            .limit(batch)
        )
        deleted = (await conn.execute(delete(job_logs).where(key.in_(some_logs)))).rowcount or 0
        counts["job_logs"] = deleted
        if deleted >= batch:
            return counts, False
        for table in (steps, job_needs, dispatch_history):
            counts[table.name] = await _delete_where_in(conn, table, table.c.job_id, job_ids)
    for table in (run_timeline, status_reports):
        counts[table.name] = await _delete_where_in(conn, table, table.c.run_id, run_ids)
    counts["jobs"] = await _delete_where_in(conn, jobs, jobs.c.run_id, run_ids)
    # Guarded again: only runs that are still ended go (nothing re-opens a run, but be certain).
    counts["runs"] = (
        await conn.execute(
            delete(runs).where(
                runs.c.id.in_(run_ids),
                runs.c.status.in_(sorted(RUN_TERMINAL)),
                runs.c.finished_at.is_not(None),
            )
        )
    ).rowcount or 0
    return counts, True


async def _delete_where_in(
    conn: AsyncConnection, table: Table, column: ColumnElement[Any], values: Sequence[str]
) -> int:
    result = await conn.execute(delete(table).where(column.in_(values)))
    return int(result.rowcount or 0)


async def delete_sent_status_reports(conn: AsyncConnection, cutoff: datetime, limit: int) -> int:
    """Delete up to `limit` status-report tracking rows last changed before `cutoff` whose newest state
    was sent (`check_run_tracking_ttl_days`, docs/design/execution.md §10.1); how many went.

    A row still owed a send is kept whatever its age. A later report for a deleted row's commit and context
    starts a new row: a new check run for a `checks` source, a new status for a `statuses` one.
    """
    settled = and_(
        status_reports.c.updated_at < cutoff, status_reports.c.sent_version >= status_reports.c.version
    )
    key = (status_reports.c.source_id, status_reports.c.sha, status_reports.c.context)
    found = [tuple(row) for row in (await conn.execute(select(*key).where(settled).limit(limit))).all()]
    if not found:
        return 0
    result = await conn.execute(delete(status_reports).where(settled, tuple_(*key).in_(found)))
    return int(result.rowcount or 0)
