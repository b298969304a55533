"""Rows of a queued job written straight to the database, for tests of queue-level code."""

from __future__ import annotations

import time

from sqlalchemy import insert
from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.db.engine import Database
from conveyor.db.tables import DEFAULT_ORG, dispatch_queue, jobs, runs
from conveyor.model.ids import new_id, utc_now


async def insert_queued_run(conn: AsyncConnection, run_id: str) -> None:
    """A queued run's row (no jobs)."""
    await conn.execute(
        insert(runs).values(
            id=run_id,
            org_id=DEFAULT_ORG,
            number=int(time.monotonic() * 1000) % 1_000_000,
            workflow="ci",
            repo="acme/app",
            routing_key="local:app",
            event={},
            status="queued",
            created_at=utc_now(),
        )
    )


async def queue_job(db: Database, *labels: str, exclude: tuple[str, ...] = ()) -> str:
    """A run with one queued job whose `runs_on` asks for `labels` (exact matchers)."""
    now = utc_now()
    run_id, job_id = new_id(), new_id()
    runs_on = {
        "labels": [{"kind": "exact", "pattern": label, "flags": ""} for label in labels],
        "exclude": [{"kind": "exact", "pattern": label, "flags": ""} for label in exclude],
    }
    async with db.transaction() as conn:
        await insert_queued_run(conn, run_id)
        await conn.execute(
            insert(jobs).values(
                id=job_id,
                run_id=run_id,
                org_id=DEFAULT_ORG,
                name="build",
                display_name="build",
                status="queued",
                runs_on=runs_on,
                created_at=now,
            )
        )
        await conn.execute(
            insert(dispatch_queue).values(
                job_id=job_id,
                run_id=run_id,
                org_id=DEFAULT_ORG,
                state="pending",
                exact_labels=sorted(labels),
                runs_on=runs_on,
                enqueued_at=now,
                not_before=now,
            )
        )
    return job_id
