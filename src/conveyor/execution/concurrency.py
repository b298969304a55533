"""Concurrency groups, `max_parallel` and `fail_fast` (docs/design/execution.md §8.1, §8.3).

The decisions are pure functions (`admit_run`, `runs_to_release`, `job_gate`, `fail_fast_applies`);
the rest applies them under the `concurrency_groups` row lock. That lock is an upsert of the
group's row, which PostgreSQL holds until commit (SQLite has one writer), so two transactions
never both see a free slot. Members are counted from `runs` and `jobs`, never stored.

- Workflow groups are scoped to the repo. With `cancel_in_progress` a new run supersedes the
  older non-terminal runs (`superseded: run <id>`); otherwise it waits `pending` while `max` runs
  of the group are `queued`, `running` or `cancelling`, and is released FIFO when a member ends.
- Job groups are scoped to the org: one job of a group at a time. A `queued` job holds the group
  too, since nothing checks the group again between the queue and an agent.
- `max_parallel` keeps at most N combinations of a matrix job `queued`, `dispatched` or `running`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.db.dialect import dialect_insert
from conveyor.db.tables import concurrency_groups, jobs, runs
from conveyor.model.states import JOB_ACTIVE

# Runs that occupy a workflow group slot.
RUN_HOLDING = frozenset({"queued", "running", "cancelling"})
# Jobs that occupy a job group (a queued job is on its way to an agent).
JOB_GROUP_HOLDING = frozenset({"queued"}) | JOB_ACTIVE
# Jobs that count against `max_parallel`.
MAX_PARALLEL_HOLDING = frozenset({"queued", "dispatched", "running"})
SUPERSEDABLE = frozenset({"pending", "queued", "running"})

Blocked = Literal["concurrency", "max_parallel"]


@dataclass(frozen=True)
class RunAdmission:
    """A new run's start: `queued` or `pending`, and the older runs it supersedes."""

    status: Literal["queued", "pending"]
    supersede: tuple[str, ...] = ()


def admit_run(
    *, cancel_in_progress: bool, max_active: int, members: Sequence[tuple[str, str]]
) -> RunAdmission:
    """Decide a new run's start from the other non-terminal runs of its group, `(run_id, status)`.

    With `cancel_in_progress` every older run not already cancelling is superseded and the new run
    starts. Otherwise the run starts only while fewer than `max_active` runs hold the group and no
    older run waits (FIFO).
    """
    if cancel_in_progress:
        return RunAdmission("queued", tuple(run_id for run_id, status in members if status in SUPERSEDABLE))
    holding = sum(1 for _, status in members if status in RUN_HOLDING)
    waiting = any(status == "pending" for _, status in members)
    return RunAdmission("queued" if holding < max_active and not waiting else "pending")


def runs_to_release(max_active: int, members: Iterable[tuple[str, str, datetime]]) -> list[str]:
    """The pending runs to start now, oldest first, from the group's `(run_id, status, created_at)`."""
    listed = list(members)
    holding = sum(1 for _, status, _ in listed if status in RUN_HOLDING)
    waiting = sorted((created, run_id) for run_id, status, created in listed if status == "pending")
    return [run_id for _, run_id in waiting[: max(0, max_active - holding)]]


def job_gate(
    *, run_pending: bool, max_parallel: int | None, siblings_holding: int, group_busy: bool
) -> Blocked | None:
    """Why a ready job must stay `pending`, or None when it may be queued now (pure)."""
    if run_pending:
        return "concurrency"
    if max_parallel is not None and siblings_holding >= max_parallel:
        return "max_parallel"
    if group_busy:
        return "concurrency"
    return None


def fail_fast_applies(status: str, *, fail_fast: bool, is_matrix: bool) -> bool:
    """Whether a matrix combination ending `status` cancels its unfinished siblings."""
    return fail_fast and is_matrix and status in ("failed", "timed_out")


def lock_entry(run_lock: dict[str, Any] | None, job_name: str) -> dict[str, Any]:
    """A job's entry in the run's stored workflow lock ({} when absent)."""
    for entry in (run_lock or {}).get("jobs", []):
        if entry.get("name") == job_name:
            return dict(entry)
    return {}


def workflow_policy(run_lock: dict[str, Any] | None) -> tuple[bool, int]:
    """`(cancel_in_progress, max)` of the run's workflow concurrency."""
    concurrency = (run_lock or {}).get("concurrency") or {}
    return bool(concurrency.get("cancel_in_progress")), int(concurrency.get("max") or 1)


async def lock_group(conn: AsyncConnection, scope: str, owner: str, key: str, now: datetime) -> None:
    """Take the group's row lock (upsert; held until commit on PostgreSQL)."""
    statement = dialect_insert(conn, concurrency_groups).values(
        scope=scope, owner=owner, group_key=key, updated_at=now
    )
    await conn.execute(
        statement.on_conflict_do_update(
            index_elements=["scope", "owner", "group_key"], set_={"updated_at": now}
        )
    )


async def run_members(
    conn: AsyncConnection, repo: str, key: str, *, exclude: str | None = None
) -> list[tuple[str, str, datetime]]:
    """Non-terminal runs of a workflow group: `(run_id, status, created_at)`."""
    query = select(runs.c.id, runs.c.status, runs.c.created_at).where(
        runs.c.repo == repo,
        runs.c.concurrency_key == key,
        runs.c.status.in_(["pending", "queued", "running", "cancelling"]),
    )
    if exclude is not None:
        query = query.where(runs.c.id != exclude)
    return [(r.id, r.status, r.created_at) for r in await conn.execute(query)]


async def job_group_busy(conn: AsyncConnection, org_id: str, key: str, *, exclude: str | None = None) -> bool:
    """Whether a job of the org's group holds it."""
    query = select(func.count()).where(
        jobs.c.org_id == org_id,
        jobs.c.concurrency_key == key,
        jobs.c.status.in_(sorted(JOB_GROUP_HOLDING)),
    )
    if exclude is not None:
        query = query.where(jobs.c.id != exclude)
    return int((await conn.execute(query)).scalar_one()) > 0


async def siblings_holding(conn: AsyncConnection, run_id: str, name: str, *, exclude: str) -> int:
    """Combinations of a matrix job counted against `max_parallel`."""
    query = select(func.count()).where(
        jobs.c.run_id == run_id,
        jobs.c.name == name,
        jobs.c.id != exclude,
        jobs.c.status.in_(sorted(MAX_PARALLEL_HOLDING)),
    )
    return int((await conn.execute(query)).scalar_one())


async def gate_ready_job(
    conn: AsyncConnection, job: dict[str, Any], run: dict[str, Any], now: datetime
) -> Blocked | None:
    """Apply `job_gate` to a job whose needs are met, taking its group's lock first."""
    entry = lock_entry(run.get("workflow_lock"), job["name"])
    if job.get("concurrency_key") and run["status"] != "pending":
        await lock_group(conn, "job", job["org_id"], job["concurrency_key"], now)
    max_parallel = entry.get("max_parallel")
    return job_gate(
        run_pending=run["status"] == "pending",
        max_parallel=max_parallel,
        siblings_holding=(
            await siblings_holding(conn, job["run_id"], job["name"], exclude=job["id"]) if max_parallel else 0
        ),
        group_busy=(
            await job_group_busy(conn, job["org_id"], job["concurrency_key"], exclude=job["id"])
            if job.get("concurrency_key") and run["status"] != "pending"
            else False
        ),
    )


def blocked_reason(blocked_on: str | None, group: str | None) -> str | None:
    """The visible reason of a job kept `pending` by a concurrency group or `max_parallel`."""
    if blocked_on == "concurrency":
        return f"waiting: concurrency group {group}" if group else "waiting: the run's concurrency group"
    if blocked_on == "max_parallel":
        return "waiting: max_parallel"
    return None
