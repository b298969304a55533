"""Fixtures for log tests: a run with one job (and named steps) inserted straight into the database."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sqlalchemy import insert, select, update

from conveyor.db.engine import Database
from conveyor.db.tables import jobs, runs, steps
from conveyor.execution import log_store
from conveyor.execution.log_store import AppendResult
from conveyor.execution.logs import named_attempt
from conveyor.model.ids import new_id, utc_now
from conveyor.model.protocol import LogLine

ROUTING_KEY = "rk-logs"


@dataclass
class RunningJob:
    """The ids of an inserted run and job."""

    run_id: str
    job_id: str


async def insert_job(
    db: Database,
    *,
    step_names: Mapping[int, str] | None = None,
    status: str = "running",
    routing_key: str = ROUTING_KEY,
    name: str = "build",
) -> RunningJob:
    """A running run with one job and the given step rows (index → name, status `running`)."""
    now = utc_now()
    run_id, job_id = new_id(), new_id()
    async with db.transaction() as conn:
        await conn.execute(
            insert(runs).values(
                id=run_id,
                org_id="default",
                number=1,
                routing_key=routing_key,
                workflow="ci",
                repo="acme/app",
                ref="refs/heads/main",
                sha="a" * 40,
                event={},
                status="running",
                created_at=now,
            )
        )
        await conn.execute(
            insert(jobs).values(
                id=job_id,
                run_id=run_id,
                org_id="default",
                name=name,
                display_name=name,
                status=status,
                runs_on={},
                created_at=now,
            )
        )
        for index, step_name in (step_names or {}).items():
            await conn.execute(
                insert(steps).values(
                    job_id=job_id,
                    step_index=index,
                    name=step_name,
                    kind="setup" if index == 0 else "step",
                    status="running",
                )
            )
    return RunningJob(run_id, job_id)


async def append(
    db: Database,
    job_id: str,
    step_index: int,
    seq: int,
    texts: Sequence[str],
    *,
    stream: str = "out",
    secrets: Sequence[str] = (),
    attempt: int | None = None,
    hop: int = 0,
) -> AppendResult:
    """Append one chunk (of `attempt` and `hop`, else of none named) in its own transaction, as the agent
    endpoint does."""
    async with db.transaction() as conn:
        return await log_store.append_chunk(
            conn,
            job_id=job_id,
            step_index=step_index,
            seq=seq,
            lines=[LogLine(ts=1_700_000_000_000 + i, stream=stream, text=t) for i, t in enumerate(texts)],  # type: ignore[arg-type]
            attempt=named_attempt(attempt, hop),
            secrets=secrets,
        )


async def finish_job(db: Database, job_id: str, status: str = "success") -> None:
    """Make the job (and its open steps) terminal, and its run with it (the run's only job), in one
    transaction, as the orchestrator ends a run with its last job."""
    now = utc_now()
    async with db.transaction() as conn:
        await conn.execute(update(jobs).where(jobs.c.id == job_id).values(status=status, finished_at=now))
        await conn.execute(
            update(steps)
            .where(steps.c.job_id == job_id, steps.c.status == "running")
            .values(status=status, finished_at=now)
        )
        run_id = (await conn.execute(select(jobs.c.run_id).where(jobs.c.id == job_id))).scalar_one()
        await conn.execute(update(runs).where(runs.c.id == run_id).values(status=status, finished_at=now))
