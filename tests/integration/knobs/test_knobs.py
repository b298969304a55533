"""Every accepted setting takes effect: one behaviour test per knob, on SQLite and PostgreSQL.

`KNOB_TESTS` names, for every knob of `conveyor.model.knobs`, the test that shows it changes
behaviour; `tests/unit/test_knob_coverage.py` fails for a knob without one (except the explicit
allowlist there). The tests of the knobs this module wires live below the table.
"""

from __future__ import annotations

import gzip
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, insert, select

from conveyor.db.engine import Database
from conveyor.db.tables import (
    DEFAULT_ORG,
    access_log,
    dispatch_history,
    job_logs,
    job_needs,
    jobs,
    run_timeline,
    runs,
    status_reports,
    steps,
)
from conveyor.model.ids import new_id, utc_now
from conveyor.runtime import runtime_services
from conveyor.runtime.lease import LeaderContext, LeaseLost
from conveyor.server.retention import RetentionSweep
from tests.support.inprocess import InProcessServer

HERE = "tests/integration/knobs/test_knobs.py"

# knob → the test (path::name) that shows it takes effect.
KNOB_TESTS: dict[str, str] = {
    "run_retention_days": f"{HERE}::test_run_retention_deletes_ended_runs_past_the_window_and_keeps_the_rest",
    "audit_retention_days": f"{HERE}::test_audit_retention_deletes_old_access_log_rows_and_zero_keeps_them",
}

DAY = timedelta(days=1)
# Test rows live in the future, so the boot-time sweep (real clock) never touches them; the tests
# sweep with a clock of their own.
BASE = utc_now() + 1000 * DAY


async def patch_cluster(server: InProcessServer, values: dict[str, Any]) -> None:
    answer = await server.client.patch("/api/v1/admin/cluster-settings", json=values, headers=server.auth())
    assert answer.status_code == 200, answer.text


def leader(server: InProcessServer) -> LeaderContext:
    context = runtime_services(server.state.services).leadership.context()
    assert context is not None, "the in-process server leads"
    return context


def sweeper(server: InProcessServer) -> RetentionSweep:
    found = server.state.services["retention"]
    assert isinstance(found, RetentionSweep)
    return found


async def history_run(
    db: Database,
    *,
    created: datetime,
    finished: datetime | None,
    status: str = "success",
    log_rows: int = 3,
) -> str:
    """A run with one job, two steps, logs, a needs edge, dispatch history, timeline and a report."""
    run_id, job_id = new_id(), new_id()
    job_status = status if finished is not None else "running"
    async with db.transaction() as conn:
        await conn.execute(
            insert(runs).values(
                id=run_id,
                org_id=DEFAULT_ORG,
                number=1,
                workflow="ci",
                repo="acme/app",
                event={},
                status=status,
                created_at=created,
                finished_at=finished,
            )
        )
        await conn.execute(
            insert(jobs).values(
                id=job_id,
                run_id=run_id,
                org_id=DEFAULT_ORG,
                name="build",
                display_name="build",
                status=job_status,
                runs_on={"labels": [], "exclude": []},
                created_at=created,
                finished_at=finished,
            )
        )
        await conn.execute(insert(job_needs).values(job_id=job_id, upstream_name="setup", run_on=["success"]))
        for index in (0, 1):
            await conn.execute(
                insert(steps).values(
                    job_id=job_id, step_index=index, name=f"s{index}", kind="step", status="success"
                )
            )
        for seq in range(log_rows):
            await conn.execute(
                insert(job_logs).values(
                    job_id=job_id,
                    step_index=1,
                    seq=seq,
                    byte_offset=seq * 6,
                    job_offset=seq * 6,
                    bytes=6,
                    line_count=1,
                    data=gzip.compress(b"hello\n"),
                    meta=[[0, "out"]],
                    created_at=created,
                )
            )
        await conn.execute(
            insert(dispatch_history).values(
                id=new_id(), job_id=job_id, attempt=1, ended_at=finished or created, outcome="finished"
            )
        )
        await conn.execute(
            insert(run_timeline).values(
                id=new_id(), run_id=run_id, at=created, source="dispatch", kind="run.created"
            )
        )
        await conn.execute(
            insert(status_reports).values(
                source_id="src",
                sha=new_id(),
                context="conveyor/ci",
                run_id=run_id,
                state="success",
                version=1,
                next_attempt_at=created,
                updated_at=created,
            )
        )
    return run_id


async def rows_of(db: Database, run_id: str) -> dict[str, int]:
    """How many rows each table holds for the run."""
    async with db.read() as conn:
        job_ids = [r.id for r in await conn.execute(select(jobs.c.id).where(jobs.c.run_id == run_id))]
        found: dict[str, int] = {}
        for table, column, values in (
            (runs, runs.c.id, [run_id]),
            (jobs, jobs.c.run_id, [run_id]),
            (run_timeline, run_timeline.c.run_id, [run_id]),
            (status_reports, status_reports.c.run_id, [run_id]),
            (steps, steps.c.job_id, job_ids),
            (job_logs, job_logs.c.job_id, job_ids),
            (job_needs, job_needs.c.job_id, job_ids),
            (dispatch_history, dispatch_history.c.job_id, job_ids),
        ):
            query = select(func.count()).select_from(table).where(column.in_(values))
            found[table.name] = (await conn.execute(query)).scalar_one()
    return found


def gone(counts: dict[str, int]) -> bool:
    return all(count == 0 for count in counts.values())


async def metric(server: InProcessServer, kind: str) -> float:
    text = (await server.client.get("/metrics")).text
    prefix = f'conveyor_retention_deleted_total{{kind="{kind}"}} '
    line = next((line for line in text.splitlines() if line.startswith(prefix)), None)
    return float(line.removeprefix(prefix)) if line else 0.0


# --- run_retention_days


async def test_run_retention_deletes_ended_runs_past_the_window_and_keeps_the_rest(
    server: InProcessServer,
) -> None:
    db = server.state.db
    await patch_cluster(server, {"run_retention_days": 30})
    old = await history_run(db, created=BASE - 40 * DAY, finished=BASE - 35 * DAY, status="failed")
    recent = await history_run(db, created=BASE - 6 * DAY, finished=BASE - 5 * DAY)
    # Ended 29 days before BASE: inside the window now, outside it two days later.
    edge = await history_run(db, created=BASE - 60 * DAY, finished=BASE - 29 * DAY, status="cancelled")
    # Created long before the window and still running: never touched, whatever the clock says.
    running = await history_run(db, created=BASE - 200 * DAY, finished=None, status="running")

    deleted = await sweeper(server).sweep(leader(server).fence, now=BASE)

    assert gone(await rows_of(db, old))
    for kept in (recent, edge, running):
        assert (await rows_of(db, kept))["runs"] == 1 and (await rows_of(db, kept))["job_logs"] == 3
    assert deleted["runs"] == 1 and deleted["job_logs"] == 3 and deleted["steps"] == 2
    assert await metric(server, "runs") == 1

    # The clock moves two days on: the edge run is now past the window; the running run stays.
    await sweeper(server).sweep(leader(server).fence, now=BASE + 2 * DAY)
    assert gone(await rows_of(db, edge))
    assert (await rows_of(db, recent))["runs"] == 1
    assert (await rows_of(db, running)) == {
        "runs": 1,
        "jobs": 1,
        "run_timeline": 1,
        "status_reports": 1,
        "steps": 2,
        "job_logs": 3,
        "job_needs": 1,
        "dispatch_history": 1,
    }
    assert await metric(server, "runs") == 2

    # 0 keeps forever.
    await patch_cluster(server, {"run_retention_days": 0})
    await sweeper(server).sweep(leader(server).fence, now=BASE + 5000 * DAY)
    assert (await rows_of(db, recent))["runs"] == 1


async def test_a_retention_backlog_goes_in_bounded_batches(server: InProcessServer) -> None:
    db = server.state.db
    await patch_cluster(server, {"run_retention_days": 1})
    old = [
        await history_run(db, created=BASE - 10 * DAY, finished=BASE - 9 * DAY, log_rows=7) for _ in range(5)
    ]
    small = RetentionSweep(db, sweeper(server).settings, batch=4, run_batch=2)
    deleted = await small.sweep(leader(server).fence, now=BASE)
    assert deleted["runs"] == 5 and deleted["job_logs"] == 35
    assert all([gone(await rows_of(db, run_id)) for run_id in old])
    # 35 log rows at most 4 per transaction: no single transaction took the backlog.
    assert small.transactions >= 35 // 4


async def test_a_node_that_lost_the_lease_deletes_nothing(server: InProcessServer) -> None:
    db = server.state.db
    await patch_cluster(server, {"run_retention_days": 1})
    old = await history_run(db, created=BASE - 10 * DAY, finished=BASE - 9 * DAY)
    current = leader(server)
    stale = LeaderContext(
        db=db, holder=current.holder, epoch=current.epoch - 1, ttl_ms=current.ttl_ms, on_lost=lambda: None
    )
    try:
        await sweeper(server).sweep(stale.fence, now=BASE)
    except LeaseLost:
        pass
    else:
        raise AssertionError("a stale epoch must not sweep")
    assert (await rows_of(db, old))["job_logs"] == 3 and (await rows_of(db, old))["runs"] == 1


# --- audit_retention_days


async def access_row(db: Database, at: datetime) -> str:
    row_id = new_id()
    async with db.transaction() as conn:
        await conn.execute(
            insert(access_log).values(
                id=row_id,
                at=at,
                actor_type="token",
                source="api",
                action="run.list",
                outcome="allowed",
                status_code=200,
            )
        )
    return row_id


async def access_ids(db: Database, ids: list[str]) -> set[str]:
    async with db.read() as conn:
        return {r.id for r in await conn.execute(select(access_log.c.id).where(access_log.c.id.in_(ids)))}


async def test_audit_retention_deletes_old_access_log_rows_and_zero_keeps_them(
    server: InProcessServer,
) -> None:
    db = server.state.db
    await patch_cluster(server, {"audit_retention_days": 30})
    old = await access_row(db, BASE - 31 * DAY)
    young = await access_row(db, BASE - 29 * DAY)
    await sweeper(server).sweep(leader(server).fence, now=BASE)
    assert await access_ids(db, [old, young]) == {young}
    assert await metric(server, "access_log") >= 1

    await patch_cluster(server, {"audit_retention_days": 0})
    await sweeper(server).sweep(leader(server).fence, now=BASE + 5000 * DAY)
    assert await access_ids(db, [young]) == {young}
