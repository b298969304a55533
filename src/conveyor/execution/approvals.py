"""Approving and rejecting held jobs, and the retention of jobs held too long
(docs/design/approvals.md §3–§4), in the caller's transaction."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.db.tables import jobs, runs
from conveyor.errors import ConveyorError
from conveyor.execution.history import timeline
from conveyor.execution.holds import environment_protection
from conveyor.execution.lifecycle import Effects, admit_job, finish_job, lock_job_for_change
from conveyor.model.approvals import (
    BLOCKED_ON,
    WAITING,
    Approver,
    Decision,
    Refusal,
    decision_refusal,
    held_retention_reason,
    rejection_reason,
)
from conveyor.model.ids import utc_now


class NotWaiting(ConveyorError):
    """The job does not wait for approval (409 `not_waiting`)."""


class DecisionRefused(ConveyorError):
    """The caller may not decide this job (403 with the refusal's code)."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.detail)
        self.refusal = refusal


@dataclass
class Decided:
    """A decision as applied: the job's status after it, the recorded approval, what followed."""

    job_id: str
    status: str
    approval: dict[str, Any]
    effects: Effects


def wait_timer_reason(until: datetime) -> str:
    """The reason an approved job shows while its environment's wait timer runs."""
    return f"waiting: wait timer until {until.strftime('%Y-%m-%dT%H:%M:%SZ')}"


async def decide(
    conn: AsyncConnection,
    run_id: str,
    job_id: str,
    *,
    approver: Approver,
    decision: Decision,
    comment: str | None,
) -> Decided:
    """Apply one approve or reject; raise `LookupError` (no such job in the run), `NotWaiting` or
    `DecisionRefused`."""
    await lock_job_for_change(conn, job_id)
    row = (await conn.execute(select(jobs).where(jobs.c.id == job_id, jobs.c.run_id == run_id))).first()
    if row is None:
        raise LookupError(job_id)
    job = dict(row._mapping)
    if job["status"] != WAITING:
        raise NotWaiting(f"job {job['display_name']} is {job['status']}, not waiting for approval")
    run = (await conn.execute(select(runs.c.triggered_by, runs.c.held).where(runs.c.id == run_id))).one()
    triggered_by = run.triggered_by
    protection = await environment_protection(conn, job["org_id"], job["environment"])
    refusal = decision_refusal(approver, job["environment"] or "", protection, triggered_by)
    if refusal is not None:
        raise DecisionRefused(refusal)
    now = utc_now()
    approval = {
        "decision": decision,
        "by": approver.token_id,
        "by_label": approver.label,
        "role": approver.role,
        "at": now.isoformat(),
        "comment": comment,
    }
    await conn.execute(update(jobs).where(jobs.c.id == job_id).values(approval=approval))
    job["approval"] = approval
    if run.held and decision == "approved":
        # Approving a held run's job approves the run (docs/design/approvals.md §6): its later jobs are
        # no longer held, though a protected environment still holds its own.
        await conn.execute(update(runs).where(runs.c.id == run_id).values(held=None))
        await timeline(conn, run_id, None, "dispatch", "run.hold_released", {"held": run.held})
    await timeline(
        conn,
        run_id,
        job_id,
        "dispatch",
        f"job.{decision}",
        {"by": approver.label or approver.token_id, "role": approver.role, "comment": comment},
    )
    effects = Effects()
    if decision == "rejected":
        effects = await finish_job(
            conn, job_id, "failed", reason=rejection_reason(approver, comment), only_from={WAITING}
        )
    else:
        wait_ms = protection.wait_timer_ms if protection is not None else 0
        until = now + timedelta(milliseconds=wait_ms) if wait_ms else None
        await admit_job(
            conn,
            job,
            effects,
            src=WAITING,
            not_before=until,
            queued_reason=wait_timer_reason(until) if until is not None else None,
        )
    status = (await conn.execute(select(jobs.c.status).where(jobs.c.id == job_id))).scalar_one()
    return Decided(job_id, status, approval, effects)


async def expire_held(conn: AsyncConnection, days: int, now: datetime) -> list[Effects]:
    """Cancel jobs that waited for approval longer than `held_run_retention_days` (0 = never)."""
    if days <= 0:
        return []
    cutoff = now - timedelta(days=days)
    overdue = await conn.execute(
        select(jobs.c.id).where(
            jobs.c.status == WAITING,
            jobs.c.blocked_on == BLOCKED_ON,
            jobs.c.blocked_since.is_not(None),
            jobs.c.blocked_since <= cutoff,
        )
    )
    reason = held_retention_reason(days)
    return [
        await finish_job(
            conn, job_id, "cancelled", reason=reason, queue_outcome="cancelled", only_from={WAITING}
        )
        for (job_id,) in list(overdue)
    ]


async def pending_approvals(conn: AsyncConnection, run_id: str) -> list[dict[str, Any]]:
    """The run's waiting jobs and who may release each (`GET runs/{id}`)."""
    rows = await conn.execute(
        select(jobs.c.id, jobs.c.display_name, jobs.c.environment, jobs.c.blocked_since, jobs.c.org_id)
        .where(jobs.c.run_id == run_id, jobs.c.status == WAITING)
        .order_by(jobs.c.created_at, jobs.c.id)
    )
    waiting = []
    for row in list(rows):
        protection = await environment_protection(conn, row.org_id, row.environment)
        waiting.append(
            {
                "job_id": row.id,
                "display_name": row.display_name,
                "environment": row.environment,
                "approvers": list(protection.approvers) if protection is not None else [],
                "since": row.blocked_since,
            }
        )
    return waiting
