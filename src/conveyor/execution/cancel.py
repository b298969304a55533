"""Cancelling runs and jobs (execution.md §8.2), in one transaction; the agents are told after commit."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.db.dialect import notify
from conveyor.db.tables import jobs, runs
from conveyor.execution.lifecycle import (
    Effects,
    conclude_run_if_done,
    finish_job,
    lock_job_for_change,
    timeline,
)
from conveyor.execution.transitions import transition
from conveyor.model.ids import utc_now
from conveyor.model.states import HOOKS_JOB, JOB_TERMINAL, RUN_TERMINAL

# NOTIFY channel (PostgreSQL) telling every coordinator a job went `cancelling`: the one holding its
# agent sends `job.cancel` at once instead of at its next poll.
CANCEL_CHANNEL = "conveyor_cancel"
CANCEL_SLACK = timedelta(minutes=5)
FORCE_SLACK = timedelta(seconds=10)


@dataclass
class CancelOutcome:
    """How many jobs were cancelled at once, how many agents must be signalled, and what followed."""

    cancelled: int = 0
    signalled: int = 0
    effects: list[Effects] = field(default_factory=list)


class AlreadyFinished(Exception):
    """The run or job is terminal (409 `run_finished` / `job_finished`)."""


async def cancel_job(
    conn: AsyncConnection, job_id: str, *, reason: str, force: bool, grace_ms: int, outcome: CancelOutcome
) -> None:
    """Cancel one job: queued ones at once, running ones through their agent."""
    # Locked before the status is read: a claim committing meanwhile is seen as `dispatched`.
    await lock_job_for_change(conn, job_id)
    row = (await conn.execute(select(jobs.c.status, jobs.c.reason).where(jobs.c.id == job_id))).one()
    if row.status in ("pending", "queued", "recovering"):
        outcome.effects.append(
            await finish_job(conn, job_id, "cancelled", reason=reason, queue_outcome="cancelled")
        )
        outcome.cancelled += 1
    elif row.status in ("dispatched", "running"):
        slack = FORCE_SLACK if force else CANCEL_SLACK
        deadline = utc_now() + timedelta(milliseconds=grace_ms) + slack
        stored = f"{reason} (force)" if force else reason
        if (
            await transition(conn, "job", job_id, "cancelling", reason=stored, cancel_deadline=deadline)
            == "changed"
        ):
            outcome.signalled += 1
            await notify(conn, CANCEL_CHANNEL, job_id)
    elif row.status == "cancelling" and force:
        # A second cancel forces; the hub re-sends with force.
        await conn.execute(
            update(jobs).where(jobs.c.id == job_id).values(reason=f"{row.reason or reason} (force)")
        )
        outcome.signalled += 1
        await notify(conn, CANCEL_CHANNEL, job_id)


async def cancel_run(
    conn: AsyncConnection,
    run_id: str,
    *,
    reason: str,
    force: bool,
    cancelled_by: str | None,
    grace_ms: int = 10_000,
) -> CancelOutcome:
    """Cancel every unfinished job of a run (the workflow-hooks job still runs when the others are done)."""
    run = (await conn.execute(select(runs.c.status).where(runs.c.id == run_id))).one()
    if run.status in RUN_TERMINAL:
        raise AlreadyFinished(f"run {run_id} already finished ({run.status})")
    now = utc_now()
    await conn.execute(
        update(runs)
        .where(runs.c.id == run_id, runs.c.cancel_requested_at.is_(None))
        .values(cancel_requested_at=now, cancelled_by=cancelled_by)
    )
    outcome = CancelOutcome()
    rows = list(
        await conn.execute(select(jobs.c.id, jobs.c.name, jobs.c.status).where(jobs.c.run_id == run_id))
    )
    for job_id, name, status in rows:
        if status in JOB_TERMINAL or name == HOOKS_JOB:
            continue
        await cancel_job(conn, job_id, reason=reason, force=force, grace_ms=grace_ms, outcome=outcome)
    await timeline(conn, run_id, None, "cancel", "run.cancel", {"reason": reason, "force": force})
    if outcome.signalled:
        await transition(conn, "run", run_id, "cancelling")
    effects = Effects()
    await conclude_run_if_done(conn, run_id, effects)
    outcome.effects.append(effects)
    return outcome
