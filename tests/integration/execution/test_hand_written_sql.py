"""Each hand-written PostgreSQL statement of `execution/sql.py` leaves the rows its SQLAlchemy twin leaves.

SQLite runs only the Core twins, so nothing else would notice the two drifting apart. Each test commits the
same rows once, then runs the statement's caller twice on PostgreSQL, in a transaction it rolls back: by
the hand-written statement, then by the Core twin (`sql.CORE_ONLY`); what the caller returned and every row
of the tables it writes (read in that transaction) must be the same. The clock is pinned, and the ids that
the two paths generate for new history and timeline rows are left out.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Table, insert, select, text, update
from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.db.engine import Database
from conveyor.db.tables import (
    DEFAULT_ORG,
    dispatch_history,
    dispatch_queue,
    jobs,
    run_timeline,
    runs,
    sources,
    steps,
)
from conveyor.execution import history, job_end, lifecycle, sql
from conveyor.execution.logs import DispatchAttempt
from conveyor.execution.queue import AgentSlot, claim_for
from conveyor.model.ids import new_id, utc_now
from tests.support.queued import queue_job

NOW = utc_now()
# The tables a claim or a job's or run's end writes, and the columns of generated ids left out.
WRITTEN: list[tuple[Table, tuple[str, ...]]] = [
    (runs, ()),
    (jobs, ()),
    (dispatch_queue, ()),
    (dispatch_history, ("id",)),
    (steps, ()),
    (run_timeline, ("id",)),
]


@pytest.fixture(autouse=True)
def pinned_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    for module in (lifecycle, job_end, history):
        monkeypatch.setattr(module, "utc_now", lambda: NOW)


async def snapshot(conn: AsyncConnection) -> dict[str, list[dict[str, Any]]]:
    found = {}
    for table, generated in WRITTEN:
        rows = [
            {k: v for k, v in row._mapping.items() if k not in generated}
            for row in await conn.execute(select(table))
        ]
        found[table.name] = sorted(rows, key=repr)
    return found


Act = Callable[[AsyncConnection], Awaitable[Any]]


async def both_paths(db: Database, act: Act) -> tuple[Any, Any]:
    """(what `act` returned, the rows after it) by the hand-written statements, then by the Core twins."""
    seen = []
    for core_only in (False, True):
        async with db.engine.connect() as conn:
            await conn.execution_options(**{sql.CORE_ONLY: core_only})
            assert sql.hand_written(conn) is not core_only
            transaction = await conn.begin()
            try:
                seen.append((await act(conn), await snapshot(conn)))
            finally:
                await transaction.rollback()
    hand_written, core = seen
    return hand_written, core


async def write(db: Database, statement: Any) -> None:
    async with db.transaction() as conn:
        await conn.execute(statement)


async def run_of(db: Database, job_id: str) -> str:
    async with db.read() as conn:
        return (await conn.execute(select(jobs.c.run_id).where(jobs.c.id == job_id))).scalar_one()


async def claimed(db: Database, job_id: str, *, step_running: bool = True) -> None:
    """The job dispatched to an agent and running a step, its queue row claimed."""
    await write(
        db,
        update(dispatch_queue)
        .where(dispatch_queue.c.job_id == job_id)
        .values(state="started", agent_id="agent-a", owner_instance_id="node", attempts=1, claimed_at=NOW),
    )
    await write(db, update(jobs).where(jobs.c.id == job_id).values(status="running", agent_id="agent-a"))
    await write(
        db,
        insert(steps).values(
            job_id=job_id,
            step_index=0,
            name="test",
            kind="run",
            status="running" if step_running else "success",
        ),
    )


# --- sql.CLAIM_CANDIDATES and sql.CLAIM_ROW (`queue.claim_for`)


async def _queue(db: Database) -> dict[str, str]:
    queued = {  # oldest first
        "not_on_gpu": await queue_job(db, "linux", exclude=("gpu",)),
        "linux": await queue_job(db, "linux"),
        "later": await queue_job(db, "linux"),
        "handed_back": await queue_job(db, "linux"),
    }
    for age, job_id in enumerate(reversed(list(queued.values()))):
        at = NOW - timedelta(seconds=age + 1)
        await write(
            db,
            update(dispatch_queue)
            .where(dispatch_queue.c.job_id == job_id)
            .values(enqueued_at=at, not_before=at, unschedulable="waiting: an agent", unschedulable_since=at),
        )
    later, handed_back = queued["later"], queued["handed_back"]
    await write(
        db,
        update(dispatch_queue)
        .where(dispatch_queue.c.job_id == later)
        .values(not_before=NOW + timedelta(minutes=1)),
    )
    await write(db, update(dispatch_queue).where(dispatch_queue.c.job_id == handed_back).values(priority=5))
    await write(db, update(jobs).where(jobs.c.id == handed_back).values(reroute_tried=["worker-1"]))
    return queued


LINUX = AgentSlot("agent-a", ("linux",), ())
GPU_WORKER = AgentSlot("agent-g", ("gpu", "linux"), (), remote=True)
# case: (agent, the row it is bound to, the row it claims)
CLAIMS: dict[str, tuple[AgentSlot, str | None, str | None]] = {
    "an agent takes the row of highest priority": (LINUX, None, "handed_back"),
    "a worker's slot never takes a row handed back": (
        AgentSlot("agent-w", ("linux",), (), remote=True),
        None,
        "not_on_gpu",
    ),
    "an agent passes over the best row when it excludes the agent": (GPU_WORKER, None, "linux"),
    "a bound agent takes its row": (LINUX, "linux", "linux"),
    "a bound agent takes nothing from a row that excludes it": (GPU_WORKER, "not_on_gpu", None),
    "a row not yet due is not taken": (LINUX, "later", None),
    "an agent no row asks for takes nothing": (AgentSlot("agent-m", ("macos",), ()), None, None),
}


@pytest.mark.parametrize("case", list(CLAIMS))
async def test_a_claim_leaves_the_rows_its_core_twin_leaves(pg_database: Database, case: str) -> None:
    agent, bound, expected = CLAIMS[case]
    queued = await _queue(pg_database)

    async def act(conn: AsyncConnection) -> Any:
        return await claim_for(
            conn,
            agent,
            owner="node",
            now=NOW,
            ack_timeout_ms=60_000,
            bound_job_id=queued[bound] if bound is not None else None,
        )

    hand_written, core = await both_paths(pg_database, act)

    assert hand_written == core
    claim = hand_written[0]
    assert (claim.job_id if claim is not None else None) == (queued[expected] if expected else None)


async def test_a_claimed_row_whose_job_will_not_dispatch_leaves_the_same_rows(pg_database: Database) -> None:
    job_id = await queue_job(pg_database, "linux")
    await write(pg_database, update(jobs).where(jobs.c.id == job_id).values(status="cancelled"))
    await write(pg_database, update(dispatch_queue).values(not_before=NOW - timedelta(seconds=1)))

    async def act(conn: AsyncConnection) -> Any:
        return await claim_for(
            conn, AgentSlot("agent-a", ("linux",), ()), owner="node", now=NOW, ack_timeout_ms=1
        )

    hand_written, core = await both_paths(pg_database, act)

    assert hand_written == core
    assert hand_written[0] is None
    (row,) = hand_written[1]["dispatch_queue"]
    assert (
        row["state"] == "claimed"
    )  # as the Core twin leaves it: the row the claim tried is not offered again


# --- sql.LOCK_RUN_FOR_FINISH and sql.LOCK_QUEUE_ROW (`job_end.lock_run_for_finish`)


async def test_a_run_locked_for_a_finish_reads_as_its_core_twin_reads_it(pg_database: Database) -> None:
    plain = await queue_job(pg_database, "linux")
    grouped = await queue_job(pg_database, "linux")
    source_id = new_id()
    await write(
        pg_database,
        insert(sources).values(
            id=source_id,
            org_id=DEFAULT_ORG,
            name="app",
            kind="git",
            routing_key="git:app",
            repo="acme/app",
            report="checks",
            created_at=NOW,
            updated_at=NOW,
        ),
    )
    await write(
        pg_database,
        update(runs)
        .where(runs.c.id == await run_of(pg_database, grouped))
        .values(
            concurrency_key="deploy",
            workflow_lock={"name": "ci"},
            source_id=source_id,
            sha="a" * 40,
            cancel_requested_at=NOW,
            reason="why",
        ),
    )
    await write(
        pg_database,
        update(runs)
        .where(runs.c.id == await run_of(pg_database, plain))
        .values(workflow_lock={"name": "ci"}),
    )

    async def act(conn: AsyncConnection) -> Any:
        return [await job_end.lock_run_for_finish(conn, job_id) for job_id in (plain, grouped, "no-such-job")]

    hand_written, core = await both_paths(pg_database, act)

    assert hand_written == core
    found_plain, found_grouped, missing = hand_written[0]
    assert found_plain["workflow_lock"] is None and found_plain["report"] is None
    assert found_grouped["workflow_lock"] == {"name": "ci"} and found_grouped["report"] == "checks"
    assert missing is None


async def _locked(db: Database) -> tuple[list[str], list[str]]:
    """The run and queue rows another transaction cannot lock now."""
    async with db.transaction() as other:
        free_runs = (await other.execute(text("SELECT id FROM runs FOR UPDATE SKIP LOCKED"))).scalars().all()
        free_rows = (
            (await other.execute(text("SELECT job_id FROM dispatch_queue FOR UPDATE SKIP LOCKED")))
            .scalars()
            .all()
        )
        all_runs = (await other.execute(text("SELECT id FROM runs"))).scalars().all()
        all_rows = (await other.execute(text("SELECT job_id FROM dispatch_queue"))).scalars().all()
    return sorted(set(all_runs) - set(free_runs)), sorted(set(all_rows) - set(free_rows))


async def test_a_run_locked_for_a_finish_locks_the_rows_every_job_change_locks(pg_database: Database) -> None:
    job_id = await queue_job(pg_database, "linux")
    await queue_job(pg_database, "linux")  # another run and queue row, left free
    locked = []
    for lock in (job_end.lock_run_for_finish, lifecycle.lock_job_for_change):
        async with pg_database.transaction() as conn:
            await lock(conn, job_id)
            locked.append(await _locked(pg_database))

    assert locked[0] == locked[1] == ([await run_of(pg_database, job_id)], [job_id])


# --- sql.END_JOB and sql.JOB_STATUSES_OF_RUN (`job_end.end_job`, `job_end.job_statuses_of_run`)


async def _ended(conn: AsyncConnection, job_id: str, status: str, **kwargs: Any) -> Any:
    applied, job, statuses = await job_end.end_job(
        conn,
        job_id,
        status,
        kwargs.get("reason"),
        kwargs.get("outputs"),
        kwargs.get("queue_outcome", "finished"),
        kwargs.get("only_from"),
        kwargs.get("counted_attempt"),
    )
    shown = {name: job[name] for name in sql.END_JOB_COLUMNS} if job is not None else None
    if statuses is None and applied == "changed":  # the Core twin reads them after
        statuses = await job_end.job_statuses_of_run(conn, job["run_id"])  # type: ignore[index]
    return applied, shown, sorted(statuses) if statuses is not None else None


ENDS = {
    "a success with outputs": ("success", {"outputs": {"version": "1.2"}}),
    "a failure with its reason": ("failed", {"reason": "exit 2", "queue_outcome": "exhausted"}),
    "a cancel refused by only_from": ("cancelled", {"reason": "x", "only_from": {"queued"}}),
    # The execution whose result counts (docs/design/execution.md §9): its log becomes the job's.
    "a result naming its execution": ("success", {"counted_attempt": DispatchAttempt(2, 1)}),
}


@pytest.mark.parametrize("case", list(ENDS))
async def test_a_jobs_end_leaves_the_rows_its_core_twin_leaves(pg_database: Database, case: str) -> None:
    status, kwargs = ENDS[case]
    job_id = await queue_job(pg_database, "linux")
    await claimed(pg_database, job_id)

    hand_written, core = await both_paths(pg_database, lambda conn: _ended(conn, job_id, status, **kwargs))

    assert hand_written == core
    applied, _, _ = hand_written[0]
    assert applied == ("refused" if "refused" in case else "changed")


async def test_the_end_of_a_job_already_ended_leaves_the_same_rows(pg_database: Database) -> None:
    job_id = await queue_job(pg_database, "linux")
    await claimed(pg_database, job_id, step_running=False)
    async with pg_database.transaction() as conn:
        await job_end.end_job(conn, job_id, "success", None, None, "finished", None)

    hand_written, core = await both_paths(pg_database, lambda conn: _ended(conn, job_id, "success"))

    assert hand_written == core
    assert hand_written[0] == ("already", None, None)


async def test_a_runs_job_statuses_read_as_their_core_twin_reads_them(pg_database: Database) -> None:
    job_id = await queue_job(pg_database, "linux")
    run_id = await run_of(pg_database, job_id)
    await write(
        pg_database,
        insert(jobs).values(
            id=new_id(),
            run_id=run_id,
            org_id=DEFAULT_ORG,
            name="test",
            display_name="test",
            status="pending",
            runs_on={},
            created_at=NOW,
        ),
    )

    async def act(conn: AsyncConnection) -> Any:
        return sorted(await job_end.job_statuses_of_run(conn, run_id))

    hand_written, core = await both_paths(pg_database, act)

    assert hand_written == core
    assert hand_written[0] == [("build", "queued"), ("test", "pending")]


# --- sql.END_RUN (`job_end.end_run`)


@pytest.mark.parametrize("run_status", ["running", "success"])
async def test_a_runs_end_leaves_the_rows_its_core_twin_leaves(
    pg_database: Database, run_status: str
) -> None:
    job_id = await queue_job(pg_database, "linux")
    run_id = await run_of(pg_database, job_id)
    await write(
        pg_database, update(jobs).where(jobs.c.id == job_id).values(status="success", finished_at=NOW)
    )
    await write(pg_database, update(runs).where(runs.c.id == run_id).values(status=run_status))

    hand_written, core = await both_paths(pg_database, lambda conn: job_end.end_run(conn, run_id, "success"))

    assert hand_written == core
    assert hand_written[0] == ("changed" if run_status == "running" else "already")


def test_the_clock_is_pinned_to_a_millisecond() -> None:
    # UTCDateTime stores milliseconds; a pinned time with more would read back different from either path.
    assert isinstance(NOW, datetime) and NOW.microsecond % 1000 == 0
