"""Cancelling runs (docs/design/execution.md §8.2), in one transaction; the agents are told after commit.

Cancelling one job (`cancel_job`) lives in `lifecycle`: a queued job's cancel finishes it, and a finished
matrix job can cancel its siblings (`fail_fast`), so the two recurse into each other and stay together.
"""

from __future__ import annotations

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.db.tables import jobs, runs
from conveyor.errors import ConveyorError
from conveyor.execution.history import timeline
from conveyor.execution.lifecycle import CancelOutcome, Effects, cancel_job, conclude_run_if_done
from conveyor.execution.transitions import transition
from conveyor.model.ids import utc_now
from conveyor.model.states import HOOKS_JOB, JOB_TERMINAL, RUN_TERMINAL


class AlreadyFinished(ConveyorError):
    """The run or job is terminal (409 `run_finished` / `job_finished`)."""


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
