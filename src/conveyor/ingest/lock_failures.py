"""A delivery whose lock file cannot be read: one failed `conveyor.lock` run, so the pusher sees a red status
(docs/design/execution.md §1)."""

from __future__ import annotations

from sqlalchemy import insert

from conveyor.db.engine import Database
from conveyor.db.tables import runs
from conveyor.ingest import store
from conveyor.ingest.providers.base import SourceRow
from conveyor.lockfile import LockReadError
from conveyor.matching import Event, lock_error_decision
from conveyor.model.ids import new_id, utc_now

LOCK_RUN_WORKFLOW = "conveyor.lock"


async def record_lock_invalid(
    db: Database,
    row_id: str,
    owner: str,
    source: SourceRow,
    event: Event,
    error: LockReadError,
    cut_body: bytes | None = None,
) -> str:
    """An unreadable lock: one failed `conveyor.lock` run so the pusher sees a red status; its id."""
    decision = lock_error_decision(event, error.code)
    now = utc_now()
    async with db.transaction() as conn:
        run_id = new_id()
        await conn.execute(
            insert(runs).values(
                id=run_id,
                org_id=source.org_id,
                number=0,
                trigger_trace=decision.as_dict(),
                source_id=source.id,
                routing_key=source.routing_key,
                delivery_id=row_id,
                workflow=LOCK_RUN_WORKFLOW,
                repo=event.repo,
                ref=event.ref,
                sha=event.sha,
                event=event.model_dump(mode="json"),
                status="failed",
                reason=f"{error.code}: {error}"[:2000],
                created_at=now,
                finished_at=now,
            )
        )
        await store.finish_delivery(
            conn,
            row_id,
            owner,
            cut_body=cut_body,
            status="lock_invalid",
            decisions=decision.as_dict(),
            run_count=1,
            error=str(error),
        )
    return run_id
