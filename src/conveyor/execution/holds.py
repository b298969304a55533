"""Holding a job for approval where it would otherwise be queued (docs/design/approvals.md §2).

Run creation and the needs scheduler ask `hold_verdict` first; `lifecycle` and `creation` import this
module, and the decisions (`approvals`) import `lifecycle`, so this piece sits below both.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import insert, select
from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.db.tables import environments, run_timeline
from conveyor.model.approvals import Protection, protection_of, ref_refusal, waiting_reason
from conveyor.model.ids import new_id

# Called in the transaction that made a job wait for approval (job id); the server plugs the
# `conveyor.approval.requested` event in here, as it does the completion events (execution never imports
# `events`).
WaitingHook = Callable[[AsyncConnection, str], Awaitable[None]]
WAITING_HOOKS: list[WaitingHook] = []


@dataclass(frozen=True)
class Hold:
    """What becomes of a job that would be queued: it waits (`reason`), or it fails (`failure`).

    `held` is the run's own hold (a fork's pull request); otherwise the environment's rule holds it.
    """

    environment: str | None
    protection: Protection | None
    failure: str | None = None
    held: str | None = None

    @property
    def reason(self) -> str:
        """The waiting job's visible reason."""
        if self.held is not None or self.protection is None:
            return f"held: {self.held}"
        return waiting_reason(self.environment or "", self.protection)


async def environment_protection(conn: AsyncConnection, org_id: str, name: str | None) -> Protection | None:
    """The protection rule of the org's environment `name` (None: no name, no such environment, or
    unprotected)."""
    if not name:
        return None
    document = (
        await conn.execute(
            select(environments.c.protection).where(
                environments.c.org_id == org_id, environments.c.name == name
            )
        )
    ).scalar_one_or_none()
    return protection_of(document)


async def hold_verdict(
    conn: AsyncConnection,
    *,
    org_id: str,
    environment: str | None,
    approval: Any,
    ref: str | None,
    held: str | None = None,
) -> Hold | None:
    """None when the job may be queued (no hold of its run, no protected environment, or already
    approved); else the hold."""
    if approval is not None:
        return None
    if held:
        return Hold(environment, await environment_protection(conn, org_id, environment), held=held)
    protection = await environment_protection(conn, org_id, environment)
    if protection is None or environment is None:
        return None
    return Hold(environment, protection, ref_refusal(environment, ref, protection))


async def job_started_waiting(
    conn: AsyncConnection, run_id: str, job_id: str, hold: Hold, now: datetime
) -> None:
    """After a job's row went `waiting_approval`: its timeline entry and the waiting hooks."""
    await conn.execute(
        insert(run_timeline).values(
            id=new_id(),
            run_id=run_id,
            job_id=job_id,
            at=now,
            source="dispatch",
            kind="job.waiting_approval",
            detail={
                "environment": hold.environment,
                "approvers": list(hold.protection.approvers) if hold.protection is not None else [],
                "held": hold.held,
            },
        )
    )
    for hook in list(WAITING_HOOKS):
        await hook(conn, job_id)
