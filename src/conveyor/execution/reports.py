"""Commit status reports (docs/design/execution.md §10): rows upserted with each transition, sent by a loop.

A row holds the commit status state and description; a `report: checks` source sends the same row
as a GitHub check run, whose status and conclusion `check_run_fields` derives from that pair.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import case, literal, null, select, text, update
from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.db.dialect import dialect_insert
from conveyor.db.tables import status_reports
from conveyor.model.ids import utc_now

# Conveyor status -> (commit status state, description).
COMMIT_STATES: dict[str, tuple[str, str]] = {
    "pending": ("pending", "Queued"),
    "waiting_approval": ("pending", "Waiting for approval"),
    "queued": ("pending", "Queued"),
    "dispatched": ("pending", "Queued"),
    "running": ("pending", "Running"),
    "recovering": ("pending", "Running"),
    "cancelling": ("pending", "Running"),
    "success": ("success", "Succeeded"),
    "skipped": ("success", "Skipped"),
    "failed": ("failure", "Failed"),
    "timed_out": ("failure", "Timed out"),
    "cancelled": ("error", "Cancelled"),
}


def commit_state(status: str) -> tuple[str, str]:
    """The commit status state and description for a run or job status."""
    return COMMIT_STATES.get(status, ("pending", status))


# Conveyor status -> (check run status, conclusion); the conclusion is None until the run completes.
CHECK_RUNS: dict[str, tuple[str, str | None]] = {
    "pending": ("queued", None),
    "waiting_approval": ("queued", None),
    "queued": ("queued", None),
    "dispatched": ("queued", None),
    "running": ("in_progress", None),
    "recovering": ("in_progress", None),
    "cancelling": ("in_progress", None),
    "success": ("completed", "success"),
    "skipped": ("completed", "skipped"),
    "failed": ("completed", "failure"),
    "timed_out": ("completed", "timed_out"),
    "cancelled": ("completed", "cancelled"),
}

# (commit state, description) -> the Conveyor status it was written for. Statuses sharing a pair
# (pending, queued, dispatched) share their check run status too, so the inversion loses nothing.
_STATUS_OF_COMMIT_STATE = {pair: status for status, pair in COMMIT_STATES.items()}


def check_run_fields(state: str, description: str) -> tuple[str, str | None]:
    """The check run `status` and `conclusion` for a stored (commit state, description) pair.

    A pair no Conveyor status writes (an unknown status is stored as `pending` with the status as
    its description) is an unfinished check run: `queued`.
    """
    status = _STATUS_OF_COMMIT_STATE.get((state, description))
    if status is None:
        return ("queued", None)
    return CHECK_RUNS[status]


def workflow_context(workflow: str, display_name: str | None = None) -> str:
    """`conveyor/<workflow>` or `conveyor/<workflow>/<job display name>`."""
    return f"conveyor/{workflow}" + (f"/{display_name}" if display_name else "")


async def upsert_report(
    conn: AsyncConnection,
    *,
    source_id: str,
    sha: str,
    context: str,
    run_id: str,
    job_id: str | None,
    status: str,
    target_url: str | None,
) -> None:
    """Record the newest state for (source, sha, context); the sender sends it once.

    The row follows the newest run on the commit (a re-run replaces it); an older run's transitions
    leave it alone.

    Every run on one commit shares its contexts' rows, and one transaction may write the workflow's
    row and a job's in either order (a job starting writes the run first, a job ending writes its own
    row first). On PostgreSQL a transaction-scoped advisory lock per (source, sha), taken before the
    first row, gives all writers one order, so they queue instead of deadlocking.
    """
    if conn.dialect.name == "postgresql":
        await conn.execute(
            text("SELECT pg_advisory_xact_lock(hashtext(:key))"),
            {"key": f"status_reports:{source_id}:{sha}"},
        )
    state, description = commit_state(status)
    now = utc_now()
    values: dict[str, Any] = {
        "source_id": source_id,
        "sha": sha,
        "context": context,
        "run_id": run_id,
        "job_id": job_id,
        "state": state,
        "description": description,
        "target_url": target_url,
        "version": 1,
        "sent_version": 0,
        "attempts": 0,
        "next_attempt_at": now,
        "updated_at": now,
    }
    statement = dialect_insert(conn, status_reports).values(**values)
    statement = statement.on_conflict_do_update(
        index_elements=["source_id", "sha", "context"],
        set_={
            "run_id": run_id,
            "job_id": job_id,
            "state": state,
            "description": description,
            "target_url": target_url,
            # A newer run on the commit gets its own check run: forget the older run's id.
            "external_id": case(
                (status_reports.c.run_id == run_id, status_reports.c.external_id), else_=None
            ),
            "version": status_reports.c.version + 1,
            "attempts": 0,
            "next_attempt_at": now,
            "updated_at": now,
        },
        # Run ids are UUIDv7, so they sort by creation: a late transition of an older run on the
        # same commit (a cancel, a slow finish) must not overwrite the newer run's state.
        where=status_reports.c.run_id <= run_id,
    )
    await conn.execute(statement)


async def unsent_reports(conn: AsyncConnection, limit: int = 50) -> list[dict[str, Any]]:
    """Rows whose newest version has not been sent and whose next attempt has come."""
    query = (
        select(status_reports)
        .where(
            status_reports.c.sent_version < status_reports.c.version,
            status_reports.c.next_attempt_at <= utc_now(),
        )
        .order_by(status_reports.c.updated_at)
        .limit(limit)
    )
    return [dict(r._mapping) for r in await conn.execute(query)]


async def mark_sent(conn: AsyncConnection, row: dict[str, Any], external_id: str | None) -> None:
    """Record that `row`'s version was delivered (a newer version written meanwhile stays unsent).

    The external id (a check run's id) is kept only while the row still belongs to the run it was
    created for: a re-run that replaced the row meanwhile starts its own check run.
    """
    kept = external_id or row.get("external_id")
    await conn.execute(
        update(status_reports)
        .where(
            status_reports.c.source_id == row["source_id"],
            status_reports.c.sha == row["sha"],
            status_reports.c.context == row["context"],
        )
        .values(
            sent_version=row["version"],
            external_id=case(
                (status_reports.c.run_id == row["run_id"], literal(kept) if kept else null()),
                else_=status_reports.c.external_id,
            ),
        )
    )


async def mark_failed_attempt(
    conn: AsyncConnection, row: dict[str, Any], delay_s: float, give_up: bool
) -> None:
    """Back off after a failed send; give up (mark as sent) after the last attempt."""
    values: dict[str, Any] = {
        "attempts": row["attempts"] + 1,
        "next_attempt_at": utc_now() + timedelta(seconds=delay_s),
    }
    if give_up:
        values["sent_version"] = row["version"]
    await conn.execute(
        update(status_reports)
        .where(
            status_reports.c.source_id == row["source_id"],
            status_reports.c.sha == row["sha"],
            status_reports.c.context == row["context"],
        )
        .values(**values)
    )
