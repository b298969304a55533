"""Cancel propagation of summoned runs (docs/design/execution.md §8.6): a job that ends other than `success` or
`skipped` cancels the runs it summoned that are still going, in the transaction of its end."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.execution.cancel import AlreadyFinished, cancel_run
from conveyor.execution.store import unfinished_summons_of_job

# The ends that leave a summoned run alone: the summoner succeeded (a run summoned without waiting goes on).
KEEPS_SUMMONS = frozenset({"success", "skipped"})


def summoner_ended_reason(job_id: str, status: str) -> str:
    """The visible reason of a summoned run cancelled because its summoner ended."""
    return f"summoner_ended: job {job_id} {status}"


async def cancel_summons_of(conn: AsyncConnection, job_id: str, status: str) -> list[str]:
    """Cancel the unfinished runs `job_id` summoned, as it ends `status`; the runs cancelled."""
    if status in KEEPS_SUMMONS:
        return []
    cancelled = []
    for run_id in await unfinished_summons_of_job(conn, job_id):
        try:
            await cancel_run(
                conn,
                run_id,
                reason=summoner_ended_reason(job_id, status),
                force=False,
                cancelled_by=f"job:{job_id}",
            )
        except AlreadyFinished:
            continue
        cancelled.append(run_id)
    return cancelled
