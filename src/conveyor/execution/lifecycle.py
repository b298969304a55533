"""What happens, in one transaction, when a job starts, ends or is cancelled
(docs/design/execution.md §4, §5, §8).

A job's terminal transaction also removes its queue row (writing history), releases or skips its
dependants, and — when it was the run's last active job — concludes the run and records the commit
statuses. Every write is guarded, so replays and races apply once.

The rows of the common case (a job's run locked and read, the job's end, the run's end) are written by
`job_end` (hand-written SQL on PostgreSQL); the timeline and dispatch history by `history`. The rest is
SQLAlchemy Core on both databases.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.db.channels import CANCEL_CHANNEL, DISPATCH_CHANNEL
from conveyor.db.dialect import notify
from conveyor.db.tables import (
    dispatch_queue,
    job_needs,
    jobs,
    runs,
    sources,
    steps,
)
from conveyor.execution.concurrency import (
    blocked_reason,
    fail_fast_applies,
    gate_ready_job,
    lock_entry,
    lock_group,
    run_members,
    runs_to_release,
    workflow_policy,
)
from conveyor.execution.depth import QUEUE_FULL, queue_full_reason, queue_room
from conveyor.execution.enqueue import exact_labels_of
from conveyor.execution.fanout import FanoutRefusal, choose_hosts, fanout_result, host_ends, start_fanout
from conveyor.execution.history import timeline
from conveyor.execution.holds import hold_verdict, job_started_waiting
from conveyor.execution.job_end import (
    end_job,
    end_run,
    job_statuses_of_run,
    lock_run_for_finish,
    run_report_column,
)
from conveyor.execution.logs import DispatchAttempt
from conveyor.execution.reports import upsert_report, workflow_context
from conveyor.execution.transitions import (
    Applied,
    transition,
)
from conveyor.model.ids import utc_now
from conveyor.model.states import JOB_TERMINAL, RUN_TERMINAL, aggregate_status, run_conclusion

CANCEL_SLACK = timedelta(minutes=5)
FORCE_SLACK = timedelta(seconds=10)


@dataclass
class Effects:
    """What a lifecycle call changed, for the caller to act on after commit."""

    finished_runs: list[str] = field(default_factory=list)
    queued_jobs: list[str] = field(default_factory=list)
    applied: Applied = "changed"


@dataclass
class CancelOutcome:
    """How many jobs were cancelled at once, how many agents must be signalled, and what followed."""

    cancelled: int = 0
    signalled: int = 0
    effects: list[Effects] = field(default_factory=list)


async def lock_job_for_change(conn: AsyncConnection, job_id: str) -> None:
    """Lock a job's run row, then its queue row, before the job row itself is written (PostgreSQL).

    Every transaction that changes a queued or dispatched job takes these row locks in one order:
    run, queue row, job. The dispatcher's claim locks the queue row and then the job; a cancel or
    a finish that wrote the job first and the queue row second deadlocked with it. SQLite's
    BEGIN IMMEDIATE already excludes every other writer, so there is nothing to order there.
    """
    if conn.dialect.name != "postgresql":
        return
    await conn.execute(
        select(runs.c.id)
        .where(runs.c.id == select(jobs.c.run_id).where(jobs.c.id == job_id).scalar_subquery())
        .with_for_update()
    )
    await conn.execute(
        select(dispatch_queue.c.job_id).where(dispatch_queue.c.job_id == job_id).with_for_update()
    )


@dataclass(frozen=True)
class ReportTarget:
    """Where a run's commit statuses go: read once per transaction (none of it ever changes for a run)."""

    source_id: str | None
    sha: str | None
    workflow: str
    report: str | None

    @property
    def reports(self) -> bool:
        """Whether the run's source takes commit statuses at all."""
        return self.report not in (None, "none") and bool(self.sha) and self.source_id is not None


async def start_job(conn: AsyncConnection, job_id: str, agent_id: str, now: datetime) -> Applied:
    """`job.started`: dispatched → running; the queue row goes `started`; the run starts."""
    await lock_job_for_change(conn, job_id)
    applied = await transition(
        conn,
        "job",
        job_id,
        "running",
        only_from={"dispatched", "recovering"},
        started_at=now,
        last_heartbeat_at=now,
    )
    if applied != "changed":
        return applied
    await conn.execute(
        update(dispatch_queue)
        .where(dispatch_queue.c.job_id == job_id)
        .values(state="started", ack_deadline=None)
    )
    run_id = (await conn.execute(select(jobs.c.run_id).where(jobs.c.id == job_id))).scalar_one()
    if await transition(conn, "run", run_id, "running", started_at=now) == "changed":
        await _report(conn, run_id, None, "running")
    await _report(conn, run_id, job_id, "running")
    return applied


async def finish_job(
    conn: AsyncConnection,
    job_id: str,
    status: str,
    *,
    reason: str | None = None,
    outputs: dict[str, Any] | None = None,
    queue_outcome: str = "finished",
    only_from: set[str] | None = None,
    counted_attempt: DispatchAttempt | None = None,
) -> Effects:
    """Make a job terminal and apply everything that follows, in the caller's transaction.

    `counted_attempt` is the dispatch attempt (and offer hop) whose execution reported this result: its log
    becomes the job's (`jobs.log_attempt`, `log_hop`, docs/design/execution.md §9). An end no execution
    reported (a sweep, a cancel) leaves the latest attempt's log shown.
    """
    assert status in JOB_TERMINAL
    run = await lock_run_for_finish(conn, job_id)
    applied, job, statuses = await end_job(
        conn, job_id, status, reason, outputs, queue_outcome, only_from, counted_attempt
    )
    effects = Effects(applied=applied)
    if applied != "changed":
        return effects
    assert job is not None and run is not None
    run_id = job["run_id"]
    target = ReportTarget(run["source_id"], run["sha"], run["workflow"], run["report"])
    await _report(conn, run_id, job_id, status, target=target, display_name=job["display_name"])
    ended_fanout = job["fanout_parent_id"] is not None and await _end_fanout_if_done(
        conn, job["fanout_parent_id"], effects
    )
    if await cancel_siblings_if_fail_fast(conn, job, status, effects) or statuses is None or ended_fanout:
        statuses = await job_statuses_of_run(conn, run_id)
    if effects.finished_runs or effects.queued_jobs or any(s == "pending" for _, s in statuses):
        await release_dependants(conn, run_id, effects)
        await release_blocked(conn, run_id, effects)
        await conclude_run_if_done(conn, run_id, effects, target=target)
    else:
        # Nothing in this transaction touched the run or another job since the run was read under its
        # lock, and no job waits on anything: the rows in hand are current, so conclude from them.
        await conclude_run_if_done(conn, run_id, effects, target=target, run=run, statuses=statuses)
    # Group locks in one order everywhere (a run's workflow group, then job groups), as at creation.
    if job["concurrency_key"]:
        await release_job_group(conn, job["org_id"], job["concurrency_key"], effects)
    return effects


async def _end_fanout_if_done(conn: AsyncConnection, parent_id: str, effects: Effects) -> bool:
    """A host execution ended: when it was the last, its fan-out job takes its result
    (docs/design/execution.md §13); whether it did."""
    result = fanout_result(await host_ends(conn, parent_id))
    if result is None:
        return False
    status, reason = result
    ended = await finish_job(conn, parent_id, status, reason=reason, only_from={"running", "cancelling"})
    effects.queued_jobs.extend(ended.queued_jobs)
    effects.finished_runs.extend(ended.finished_runs)
    return ended.applied == "changed"


async def jobs_of_run(conn: AsyncConnection, run_id: str) -> list[dict[str, Any]]:
    """Every job row of a run."""
    return [dict(r._mapping) for r in await conn.execute(select(jobs).where(jobs.c.run_id == run_id))]


async def release_dependants(conn: AsyncConnection, run_id: str, effects: Effects) -> None:
    """Re-evaluate the run's pending jobs whose upstreams are now all terminal
    (docs/design/execution.md §8.1), cascading skips."""
    changed = True
    while changed:
        changed = False
        run_jobs = await jobs_of_run(conn, run_id)
        by_name: dict[str, list[str]] = {}
        for job in run_jobs:
            by_name.setdefault(job["name"], []).append(job["status"])
        pending = [j for j in run_jobs if j["status"] == "pending" and j["blocked_on"] == "needs"]
        if not pending:
            return
        edges = await conn.execute(
            select(job_needs).where(job_needs.c.job_id.in_([j["id"] for j in pending]))
        )
        needs: dict[str, list[tuple[str, list[str]]]] = {}
        for edge in edges:
            needs.setdefault(edge.job_id, []).append((edge.upstream_name, list(edge.run_on)))
        for job in pending:
            verdict = needs_verdict(needs.get(job["id"], []), by_name)
            if verdict is None:
                continue
            if verdict == "ready":
                await admit_job(conn, job, effects)
            else:
                now = utc_now()
                if (
                    await transition(conn, "job", job["id"], "skipped", reason=verdict, finished_at=now)
                    == "changed"
                ):
                    await _report(conn, run_id, job["id"], "skipped")
                    changed = True


def needs_verdict(
    edges: Iterable[tuple[str, list[str]]], statuses_by_name: dict[str, list[str]]
) -> str | None:
    """`ready`, a skip reason `needs: <job> <status>`, or None while an upstream is unfinished (pure)."""
    for upstream, run_on in edges:
        aggregate = aggregate_status(statuses_by_name.get(upstream, []))
        if aggregate is None:
            return None
        if aggregate not in run_on:
            return f"needs: {upstream} {aggregate}"
    return "ready"


async def enqueue_existing(
    conn: AsyncConnection, job: dict[str, Any], *, not_before: datetime | None = None
) -> None:
    """Queue row for a job released from `pending` (or approved: `not_before` is its wait timer)."""
    now = utc_now()
    await conn.execute(
        insert(dispatch_queue).values(
            job_id=job["id"],
            run_id=job["run_id"],
            org_id=job["org_id"],
            state="pending",
            exact_labels=exact_labels_of(job["runs_on"]),
            runs_on=job["runs_on"],
            enqueued_at=now,
            not_before=max(now, not_before) if not_before is not None else now,
        )
    )
    await notify(conn, DISPATCH_CHANNEL, job["run_id"])


async def conclude_run_if_done(
    conn: AsyncConnection,
    run_id: str,
    effects: Effects,
    *,
    target: ReportTarget | None = None,
    run: dict[str, Any] | None = None,
    statuses: list[tuple[str, str]] | None = None,
) -> None:
    """When every job is terminal, the run takes its conclusion (docs/design/execution.md §4).

    `run` and `statuses` (the run's row and its jobs' names and statuses) save the reads when the
    caller holds them current.
    """
    if run is None:
        run = dict((await conn.execute(select(runs).where(runs.c.id == run_id))).one()._mapping)
    if run["status"] in RUN_TERMINAL:
        return
    if statuses is None:
        statuses = await job_statuses_of_run(conn, run_id)
    if any(status not in JOB_TERMINAL for _, status in statuses):
        return
    timed_out = (run["reason"] or "").startswith("workflow_timeout")
    conclusion = run_conclusion(
        statuses, cancel_requested=run["cancel_requested_at"] is not None, workflow_timed_out=timed_out
    )
    if await end_run(conn, run_id, conclusion) == "changed":
        effects.finished_runs.append(run_id)
        await _report(conn, run_id, None, conclusion, target=target)
        if run["concurrency_key"]:
            await release_runs(conn, run["repo"], run["concurrency_key"], run, effects)


# --- concurrency groups, max_parallel and fail_fast (docs/design/execution.md §8.1, §8.3)


async def admit_job(
    conn: AsyncConnection,
    job: dict[str, Any],
    effects: Effects,
    *,
    src: str = "pending",
    not_before: datetime | None = None,
    queued_reason: str | None = None,
) -> bool:
    """Queue a job whose needs are met, unless its environment holds it for approval or its run, group or
    `max_parallel` keeps it pending.

    `src` is `waiting_approval` for a job just approved (docs/design/approvals.md §3); `not_before` delays
    its queue row (the environment's wait timer) and `queued_reason` says so meanwhile.
    """
    now = utc_now()
    run = dict((await conn.execute(select(runs).where(runs.c.id == job["run_id"]))).one()._mapping)
    hold = await hold_verdict(
        conn,
        org_id=job["org_id"],
        environment=job.get("environment"),
        approval=job.get("approval"),
        ref=run["ref"],
        held=run.get("held"),
    )
    if hold is not None and hold.failure is not None:
        refused = await finish_job(conn, job["id"], "failed", reason=hold.failure, only_from={src})
        effects.finished_runs.extend(refused.finished_runs)
        effects.queued_jobs.extend(refused.queued_jobs)
        return False
    if hold is not None:
        if (
            await transition(
                conn,
                "job",
                job["id"],
                "waiting_approval",
                only_from={src},
                blocked_on="approval",
                blocked_since=now,
                reason=hold.reason,
            )
            == "changed"
        ):
            await job_started_waiting(conn, job["run_id"], job["id"], hold, now)
        return False
    blocked = await gate_ready_job(conn, job, run, now)
    if blocked is not None:
        if src != "pending":
            await transition(
                conn,
                "job",
                job["id"],
                "pending",
                only_from={src},
                blocked_on=blocked,
                blocked_since=now,
                reason=blocked_reason(blocked, job.get("concurrency_key")),
            )
            return False
        await conn.execute(
            update(jobs)
            .where(jobs.c.id == job["id"], jobs.c.status == "pending")
            .values(
                blocked_on=blocked,
                blocked_since=func.coalesce(jobs.c.blocked_since, now),
                reason=blocked_reason(blocked, job.get("concurrency_key")),
            )
        )
        return False
    room, limit = await queue_room(conn)
    if room <= 0:
        # The queue is full (`queue_max_depth`): the job fails visibly instead of waiting unseen.
        if await _refuse(conn, job["id"], queue_full_reason(limit), src, effects):
            QUEUE_FULL.inc()
        return False
    hosts = await _fanout_hosts(conn, job, src, effects) if job.get("fanout") else ()
    if hosts is None:
        return False
    applied = await transition(
        conn,
        "job",
        job["id"],
        "queued",
        only_from={src},
        blocked_on=None,
        blocked_since=None,
        reason=queued_reason,
        queued_at=now,
    )
    if applied != "changed":
        return False
    if hosts:
        effects.queued_jobs.extend(await start_fanout(conn, job, hosts, now))
        await notify(conn, DISPATCH_CHANNEL, job["run_id"])
    else:
        await enqueue_existing(conn, job, not_before=not_before)
        effects.queued_jobs.append(job["id"])
    return True


async def _fanout_hosts(
    conn: AsyncConnection, job: dict[str, Any], src: str, effects: Effects
) -> tuple[str, ...] | None:
    """A fan-out job's hosts, chosen as it is queued (docs/design/execution.md §13); None when it failed instead."""
    chosen = await choose_hosts(conn, job["org_id"], job["runs_on"])
    if not isinstance(chosen, FanoutRefusal):
        return chosen
    await _refuse(conn, job["id"], chosen.reason, src, effects)
    return None


async def _refuse(conn: AsyncConnection, job_id: str, reason: str, src: str, effects: Effects) -> bool:
    """A job about to be queued fails instead (`reason`), with what follows; whether it did."""
    refused = await finish_job(conn, job_id, "failed", reason=reason, only_from={src})
    effects.finished_runs.extend(refused.finished_runs)
    effects.queued_jobs.extend(refused.queued_jobs)
    return refused.applied == "changed"


async def release_blocked(conn: AsyncConnection, run_id: str, effects: Effects) -> None:
    """Re-admit the run's jobs waiting on `max_parallel` or a group, oldest first."""
    waiting = await conn.execute(
        select(jobs)
        .where(
            jobs.c.run_id == run_id,
            jobs.c.status == "pending",
            jobs.c.blocked_on.in_(["concurrency", "max_parallel"]),
        )
        .order_by(jobs.c.created_at, jobs.c.id)
    )
    for row in list(waiting):
        await admit_job(conn, dict(row._mapping), effects)


async def release_job_group(conn: AsyncConnection, org_id: str, key: str, effects: Effects) -> None:
    """A job of the group ended: admit the group's oldest waiting job (FIFO) whose run has started."""
    await lock_group(conn, "job", org_id, key, utc_now())
    waiting = await conn.execute(
        select(jobs)
        .join(runs, runs.c.id == jobs.c.run_id)
        .where(
            jobs.c.org_id == org_id,
            jobs.c.concurrency_key == key,
            jobs.c.status == "pending",
            jobs.c.blocked_on == "concurrency",
            runs.c.status != "pending",
        )
        .order_by(jobs.c.blocked_since, jobs.c.created_at, jobs.c.id)
        .limit(20)
    )
    for row in list(waiting):
        if await admit_job(conn, dict(row._mapping), effects):
            return


async def release_runs(
    conn: AsyncConnection, repo: str, key: str, ended: dict[str, Any], effects: Effects
) -> None:
    """A run of a workflow group ended: start the oldest pending runs while the group has room."""
    await lock_group(conn, "run", repo, key, utc_now())
    _, max_active = workflow_policy(ended.get("workflow_lock"))
    for run_id in runs_to_release(max_active, await run_members(conn, repo, key)):
        if await transition(conn, "run", run_id, "queued", only_from={"pending"}, reason=None) != "changed":
            continue
        await timeline(conn, run_id, None, "dispatch", "run.released", {"group": key})
        startable = await conn.execute(
            select(jobs)
            .where(jobs.c.run_id == run_id, jobs.c.status == "pending", jobs.c.blocked_on == "concurrency")
            .order_by(jobs.c.created_at, jobs.c.id)
        )
        for row in list(startable):
            await admit_job(conn, dict(row._mapping), effects)


# --- cancelling a job (docs/design/execution.md §8.2): here, not in `cancel`, because finishing a job can
# cancel its siblings (fail_fast) and cancelling a queued job finishes it, so the two recurse into each other.


async def cancel_job(
    conn: AsyncConnection, job_id: str, *, reason: str, force: bool, grace_ms: int, outcome: CancelOutcome
) -> None:
    """Cancel one job: queued ones at once, running ones through their agent."""
    # Locked before the status is read: a claim committing meanwhile is seen as `dispatched`.
    await lock_job_for_change(conn, job_id)
    row = (await conn.execute(select(jobs.c.status, jobs.c.reason).where(jobs.c.id == job_id))).one()
    if row.status in ("pending", "waiting_approval", "queued", "recovering"):
        outcome.effects.append(
            await finish_job(conn, job_id, "cancelled", reason=reason, queue_outcome="cancelled")
        )
        outcome.cancelled += 1
    elif row.status in ("dispatched", "running"):
        slack = FORCE_SLACK if force else CANCEL_SLACK
        deadline = utc_now() + timedelta(milliseconds=grace_ms) + slack
        stored = f"{reason} (force)" if force else reason
        if (
            await transition(conn, "job", job_id, "cancelling", reason=stored, cancel_deadline=deadline)
            == "changed"
        ):
            outcome.signalled += 1
            await notify(conn, CANCEL_CHANNEL, job_id)
    elif row.status == "cancelling" and force:
        # A second cancel forces; the hub re-sends with force.
        await conn.execute(
            update(jobs).where(jobs.c.id == job_id).values(reason=f"{row.reason or reason} (force)")
        )
        outcome.signalled += 1
        await notify(conn, CANCEL_CHANNEL, job_id)


async def cancel_siblings_if_fail_fast(
    conn: AsyncConnection, job: dict[str, Any], status: str, effects: Effects
) -> bool:
    """`fail_fast`: a failed or timed-out combination cancels its unfinished siblings; whether any was."""
    if not job["matrix_key"] or status not in ("failed", "timed_out"):
        return False
    lock = (await conn.execute(select(runs.c.workflow_lock).where(runs.c.id == job["run_id"]))).scalar_one()
    entry = lock_entry(lock, job["name"])
    if not fail_fast_applies(status, fail_fast=bool(entry.get("fail_fast")), is_matrix=True):
        return False
    siblings = await conn.execute(
        select(jobs.c.id).where(
            jobs.c.run_id == job["run_id"],
            jobs.c.name == job["name"],
            jobs.c.id != job["id"],
            jobs.c.status.not_in(sorted(JOB_TERMINAL | {"cancelling"})),
        )
    )
    outcome = CancelOutcome()
    grace = int(entry.get("grace_period_ms") or 10_000)
    for (sibling,) in list(siblings):
        await cancel_job(conn, sibling, reason="fail_fast", force=False, grace_ms=grace, outcome=outcome)
    for sub in outcome.effects:
        effects.queued_jobs.extend(sub.queued_jobs)
        effects.finished_runs.extend(sub.finished_runs)
    return outcome.cancelled + outcome.signalled > 0


async def _report(
    conn: AsyncConnection,
    run_id: str,
    job_id: str | None,
    status: str,
    *,
    target: ReportTarget | None = None,
    display_name: str | None = None,
) -> None:
    """Upsert the commit status of the run (job_id None) or one job, when its source reports.

    `target` (the run's source, SHA, workflow and the source's `report`) and the job's `display_name`
    save their reads when the caller already has them.
    """
    if target is None:
        found = (
            await conn.execute(
                select(runs.c.source_id, runs.c.sha, runs.c.workflow, run_report_column())
                .join(sources, sources.c.id == runs.c.source_id)
                .where(runs.c.id == run_id)
            )
        ).first()
        if found is None:
            return
        target = ReportTarget(found.source_id, found.sha, found.workflow, found.report)
    if not target.reports:
        return
    assert target.source_id is not None and target.sha is not None
    display = None
    if job_id is not None:
        display = display_name
        if display is None:
            display = (
                await conn.execute(select(jobs.c.display_name).where(jobs.c.id == job_id))
            ).scalar_one()
    await upsert_report(
        conn,
        source_id=target.source_id,
        sha=target.sha,
        context=workflow_context(target.workflow, display),
        run_id=run_id,
        job_id=job_id,
        status=status,
        target_url=None,
    )


async def record_step(conn: AsyncConnection, job_id: str, step_index: int, **values: Any) -> None:
    """`step.started` / `step.finished`: insert the step row, or update it while it is still running.

    A finished step is never reopened; a replay of the same final status is harmless.
    """
    values = {k: v for k, v in values.items() if v is not None}
    existing = (
        await conn.execute(
            select(steps.c.status).where(steps.c.job_id == job_id, steps.c.step_index == step_index)
        )
    ).first()
    if existing is None:
        values.setdefault("name", f"step {step_index}")
        values.setdefault("kind", "step")
        await conn.execute(steps.insert().values(job_id=job_id, step_index=step_index, **values))
    elif existing.status == "running" or values.get("status") == existing.status:
        await conn.execute(
            update(steps).where(steps.c.job_id == job_id, steps.c.step_index == step_index).values(**values)
        )
