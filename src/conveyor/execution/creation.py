"""Creating a run and its jobs from a matched workflow, in the caller's transaction
(docs/design/execution.md §2)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.db.channels import DISPATCH_CHANNEL
from conveyor.db.dialect import next_counter, notify
from conveyor.db.tables import dispatch_queue, job_needs, jobs, run_numbers, run_timeline, runs
from conveyor.execution.cancel import AlreadyFinished, cancel_run
from conveyor.execution.concurrency import (
    Blocked,
    RunAdmission,
    admit_run,
    blocked_reason,
    job_gate,
    job_group_busy,
    lock_group,
    run_members,
)
from conveyor.execution.depth import QUEUE_FULL, queue_full_reason, queue_room
from conveyor.execution.enqueue import exact_labels_of
from conveyor.execution.fanout import FanoutRefusal, choose_hosts, start_fanout
from conveyor.execution.history import timeline
from conveyor.execution.holds import Hold, hold_verdict, job_started_waiting
from conveyor.execution.lifecycle import Effects, conclude_run_if_done, release_dependants
from conveyor.lockfile import WorkflowEntry
from conveyor.matching import Event, PlannedJob, plan_workflow
from conveyor.model.ids import new_id, utc_now


@dataclass(frozen=True)
class RunOrigin:
    """Where a run came from: the source and the delivery or event that caused it."""

    org_id: str
    source_id: str | None
    routing_key: str | None
    delivery_id: str | None = None
    event_id: str | None = None
    registration_id: str | None = None
    chain_depth: int = 0
    parent_run_id: str | None = None
    # The admin token that started the run (a manual run, a re-run), for `prevent_self_approval`.
    triggered_by: str | None = None
    # A hold on every job of the run until approved (`fork pull request`, docs/design/approvals.md §6).
    held: str | None = None
    # The run and job whose step summoned this run, and `<job_id>:<request_id>` (docs/design/execution.md §8.6).
    summoned_by_run_id: str | None = None
    summoned_by_job_id: str | None = None
    summon_key: str | None = None
    # The policy source of a global workflow's run, and whether it is required
    # (docs/design/global_workflows.md §5).
    global_source: str | None = None
    global_required: bool = False


@dataclass(frozen=True)
class SummonLink:
    """What a summoned run carries of its summoner (docs/design/execution.md §8.6): the run and job, the
    resend key, its chain depth, and the commit it is pinned to (a summon into the summoner's own source)."""

    run_id: str
    job_id: str
    key: str
    chain_depth: int
    branch: str | None = None
    sha: str | None = None

    def origin_fields(self) -> dict[str, Any]:
        """What `RunOrigin` carries of the link."""
        return {
            "chain_depth": self.chain_depth,
            "summoned_by_run_id": self.run_id,
            "summoned_by_job_id": self.job_id,
            "summon_key": self.key,
        }


def run_workflow_name(origin: RunOrigin, workflow: WorkflowEntry) -> str:
    """The run's `workflow`: a global workflow's is `<policy routing key>/<name>`, unique beside a local
    workflow of the same name (docs/design/global_workflows.md §5)."""
    return f"{origin.global_source}/{workflow.name}" if origin.global_source else workflow.name


@dataclass(frozen=True)
class CreatedRun:
    """A run this call inserted (None from `create_run` means an earlier attempt already had)."""

    id: str
    number: int
    workflow: str
    status: str
    job_ids: list[str]
    queued_job_ids: list[str]


def initial_job_status(job: PlannedJob) -> tuple[str, str | None]:
    """A new job's status and what it waits on: jobs without needs are queued at once."""
    return ("pending", "needs") if job.needs else ("queued", None)


def held_job_status(hold: Hold) -> tuple[str, str | None]:
    """A new job its environment (or its run) holds: refused outright, or waiting for an approver."""
    return ("failed", None) if hold.failure else ("waiting_approval", "approval")


def lock_digest(workflow: WorkflowEntry) -> str:
    """SHA-256 of the workflow's lock entry as stored with the run."""
    document = workflow.model_dump(mode="json", by_alias=True)
    return hashlib.sha256(json.dumps(document, sort_keys=True).encode()).hexdigest()


@dataclass
class JobGates:
    """What a new run's jobs took so far of `max_parallel`, job groups and the queue's room (no I/O).

    Jobs are decided in plan order: each one queued counts against its name's `max_parallel` and holds its
    group for the jobs after it. The queue's room (`room left`, `queue_max_depth`) is read at the first job
    that may be queued; a group no job of the run holds yet is asked of the database (`needs_group_check`).
    """

    run_pending: bool
    max_parallel: Mapping[str, int | None]
    room: tuple[int, int] | None = None
    queued_per_name: dict[str, int] = field(default_factory=dict)
    groups_taken: set[str] = field(default_factory=set)

    def needs_group_check(self, group: str | None) -> bool:
        """Whether the group must be locked and asked whether another job holds it."""
        return group is not None and not self.run_pending and group not in self.groups_taken

    def gate(self, name: str, group: str | None) -> Blocked | None:
        """Why a job of `name` in `group`, ready to be queued, stays `pending` (`job_gate`), or None."""
        return job_gate(
            run_pending=self.run_pending,
            max_parallel=self.max_parallel.get(name),
            siblings_holding=self.queued_per_name.get(name, 0),
            group_busy=group in self.groups_taken if group is not None else False,
        )

    def take(self, name: str, group: str | None) -> bool:
        """Queue one more job of `name`: False when the queue is full (the room must be read first)."""
        assert self.room is not None
        if self.room[0] <= 0:
            return False
        self.room = (self.room[0] - 1, self.room[1])
        self.queued_per_name[name] = self.queued_per_name.get(name, 0) + 1
        if group is not None:
            self.groups_taken.add(group)
        return True


def run_row(
    *,
    run_id: str,
    number: int,
    origin: RunOrigin,
    workflow: WorkflowEntry,
    event: Event,
    group: str | None,
    admission: RunAdmission,
    trigger_trace: dict[str, Any] | None,
    now: datetime,
) -> dict[str, Any]:
    """The `runs` row of a new run of `workflow` for `event` in concurrency `group` (None: none)."""
    return {
        "id": run_id,
        "org_id": origin.org_id,
        "number": number,
        "trigger_trace": trigger_trace,
        "source_id": origin.source_id,
        "routing_key": origin.routing_key,
        "delivery_id": origin.delivery_id,
        "event_id": origin.event_id,
        "registration_id": origin.registration_id,
        "chain_depth": origin.chain_depth,
        "workflow": run_workflow_name(origin, workflow),
        "global_source": origin.global_source,
        "global_required": origin.global_required,
        "repo": event.repo,
        "ref": event.ref,
        "sha": event.sha,
        "event": event.model_dump(mode="json"),
        "lock_sha256": lock_digest(workflow),
        "workflow_lock": workflow.model_dump(mode="json", by_alias=True),
        "status": admission.status,
        "reason": f"waiting: concurrency group {group}" if admission.status == "pending" else None,
        "concurrency_key": group,
        "parent_run_id": origin.parent_run_id,
        "triggered_by": origin.triggered_by,
        "held": origin.held,
        "summoned_by_run_id": origin.summoned_by_run_id,
        "summoned_by_job_id": origin.summoned_by_job_id,
        "summon_key": origin.summon_key,
        "created_at": now,
        "deadline_at": now + timedelta(milliseconds=workflow.timeout_ms) if workflow.timeout_ms else None,
    }


def _creation_reason(
    status: str, blocked_on: str | None, hold: Hold | None, room: tuple[int, int] | None, group: str | None
) -> str | None:
    """A new job's visible reason: held for approval, refused, or waiting on a gate."""
    if hold is not None and status in ("failed", "waiting_approval"):
        return hold.failure if status == "failed" else hold.reason
    if status == "failed" and room is not None:
        return queue_full_reason(room[1])
    return blocked_reason(blocked_on, group)


def job_row(
    planned: PlannedJob,
    *,
    job_id: str,
    run_id: str,
    org_id: str,
    status: str,
    blocked_on: str | None,
    reason: str | None,
    timeout_ms: int | None,
    outputs: dict[str, Any] | None,
    now: datetime,
) -> dict[str, Any]:
    """The `jobs` row of a new job: when it was queued, blocked since or finished follows from its status."""
    return {
        "id": job_id,
        "run_id": run_id,
        "org_id": org_id,
        "name": planned.job,
        "matrix_key": planned.matrix_key or "",
        "display_name": planned.display,
        "matrix": planned.matrix,
        "status": status,
        "blocked_on": blocked_on,
        "runs_on": planned.runs_on.model_dump(mode="json"),
        "environment": planned.environment,
        "concurrency_key": planned.concurrency_group,
        "timeout_ms": timeout_ms,
        "created_at": now,
        "queued_at": now if status == "queued" else None,
        "blocked_since": now if blocked_on in ("concurrency", "max_parallel", "approval") else None,
        "reason": reason,
        "outputs": outputs,
        "finished_at": now if status in ("success", "failed") else None,
        "fanout": planned.fanout,
    }


@dataclass
class _NewJobs:
    """The jobs a new run's transaction inserted, by what follows for them once all are in."""

    ids: list[str] = field(default_factory=list)
    queued: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    queue_full: list[str] = field(default_factory=list)
    held: list[tuple[str, Hold]] = field(default_factory=list)


async def create_run(
    conn: AsyncConnection,
    *,
    origin: RunOrigin,
    workflow: WorkflowEntry,
    event: Event,
    trigger_trace: dict[str, Any] | None,
    copied: Mapping[tuple[str, str], dict[str, Any] | None] | None = None,
) -> CreatedRun | None:
    """Insert the run, its jobs, needs edges and the queue rows of jobs without needs.

    Idempotent per (delivery, workflow), per (event, registration) and per summon key: a conflict means an earlier
    attempt created this run, and nothing is written. `copied` maps `(job, matrix_key)` to the
    outputs of a parent run's successful job: a failed-only re-run creates those jobs `success`.
    """
    name = run_workflow_name(origin, workflow)
    if await _run_exists(conn, origin, name):
        return None
    now = utc_now()
    run_id = new_id()
    repo = event.repo
    number = await next_counter(
        conn, run_numbers, {"org_id": origin.org_id, "repo": repo, "workflow": name}, "last_number"
    )
    plan = plan_workflow(workflow, event)
    admission = await _run_admission(conn, workflow, repo, plan.concurrency_group, now)
    values = run_row(
        run_id=run_id,
        number=number,
        origin=origin,
        workflow=workflow,
        event=event,
        group=plan.concurrency_group,
        admission=admission,
        trigger_trace=trigger_trace,
        now=now,
    )
    try:
        async with conn.begin_nested():
            await conn.execute(insert(runs).values(**values))
    except IntegrityError:
        if await _run_exists(conn, origin, name):
            return None
        raise
    gates = JobGates(
        run_pending=admission.status == "pending",
        max_parallel={entry.name: entry.max_parallel for entry in workflow.jobs},
    )
    timeouts = {entry.name: entry.timeout_ms for entry in workflow.jobs}
    created = _NewJobs()
    for planned in plan.jobs:
        await _insert_job(conn, planned, run_id, origin, event, gates, timeouts, copied, created, now)
    await conn.execute(
        insert(run_timeline).values(
            id=new_id(),
            run_id=run_id,
            at=now,
            source="dispatch",
            kind="run.created",
            detail={"jobs": len(created.ids)},
        )
    )
    for job_id, hold in created.held:
        await job_started_waiting(conn, run_id, job_id, hold, now)
    for older in admission.supersede:
        await supersede_run(conn, older, by=run_id)
    queued = created.queued
    if copied or created.refused:
        # Dependants of copied (or refused) jobs may be ready (or skipped) already; a run whose jobs
        # were all copied or refused is done.
        room = gates.room
        for job_id in created.queue_full:
            await timeline(conn, run_id, job_id, "dispatch", "job.queue_full", {"limit": room and room[1]})
        effects = Effects()
        await release_dependants(conn, run_id, effects)
        await conclude_run_if_done(conn, run_id, effects)
        queued.extend(effects.queued_jobs)
    if queued:
        await notify(conn, DISPATCH_CHANNEL, run_id)
    return CreatedRun(run_id, number, name, admission.status, created.ids, queued)


async def _run_admission(
    conn: AsyncConnection, workflow: WorkflowEntry, repo: str, group: str | None, now: datetime
) -> RunAdmission:
    """A new run's start (`admit_run`), decided under its workflow group's lock from the group's runs."""
    if group is None or workflow.concurrency is None:
        return RunAdmission("queued")
    await lock_group(conn, "run", repo, group, now)
    members = await run_members(conn, repo, group)
    return admit_run(
        cancel_in_progress=workflow.concurrency.cancel_in_progress,
        max_active=workflow.concurrency.max,
        members=[(run_id, status) for run_id, status, _ in members],
    )


async def _insert_job(
    conn: AsyncConnection,
    planned: PlannedJob,
    run_id: str,
    origin: RunOrigin,
    event: Event,
    gates: JobGates,
    timeouts: Mapping[str, int | None],
    copied: Mapping[tuple[str, str], dict[str, Any] | None] | None,
    created: _NewJobs,
    now: datetime,
) -> None:
    """One planned job's rows (job, needs edges, queue row), noted in `created` by what follows for it."""
    job_id = new_id()
    copy_key = (planned.job, planned.matrix_key or "")
    is_copy = copied is not None and copy_key in copied
    status, blocked_on, hold = await _new_job_status(
        conn, planned, origin, event, gates, is_copy=is_copy, now=now
    )
    reason = _creation_reason(status, blocked_on, hold, gates.room, planned.concurrency_group)
    hosts: tuple[str, ...] = ()
    if planned.fanout and status == "queued":
        # docs/design/execution.md §13: the hosts are the connected matching agents now, or the job fails now.
        chosen = await choose_hosts(conn, origin.org_id, planned.runs_on.model_dump(mode="json"))
        if isinstance(chosen, FanoutRefusal):
            status, reason = "failed", chosen.reason
        else:
            hosts = chosen
    row = job_row(
        planned,
        job_id=job_id,
        run_id=run_id,
        org_id=origin.org_id,
        status=status,
        blocked_on=blocked_on,
        reason=reason,
        timeout_ms=timeouts.get(planned.job),
        outputs=copied.get(copy_key) if status == "success" and copied is not None else None,
        now=now,
    )
    await conn.execute(insert(jobs).values(**row))
    if status == "failed":
        if hold is None and not (reason or "").startswith("fanout_"):
            QUEUE_FULL.inc()
            created.queue_full.append(job_id)
        created.refused.append(job_id)
    elif status == "waiting_approval" and hold is not None:
        created.held.append((job_id, hold))
    for upstream, run_on in planned.needs:
        await conn.execute(
            insert(job_needs).values(job_id=job_id, upstream_name=upstream, run_on=list(run_on))
        )
    if hosts:
        created.queued.extend(await start_fanout(conn, row, hosts, now))
    elif status == "queued":
        await enqueue_job(conn, job_id=job_id, run_id=run_id, org_id=origin.org_id, job=planned, now=now)
        created.queued.append(job_id)
    created.ids.append(job_id)


async def _new_job_status(
    conn: AsyncConnection,
    planned: PlannedJob,
    origin: RunOrigin,
    event: Event,
    gates: JobGates,
    *,
    is_copy: bool,
    now: datetime,
) -> tuple[str, str | None, Hold | None]:
    """A new job's status, what it waits on and its environment's hold, reading what the decisions need: the
    hold (docs/design/approvals.md §2: before any gate), its group under the group's lock, the queue's room."""
    status, blocked_on = initial_job_status(planned)
    if is_copy:
        return "success", None, None
    if status != "queued":
        return status, blocked_on, None
    hold = await hold_verdict(
        conn,
        org_id=origin.org_id,
        environment=planned.environment,
        approval=None,
        ref=event.ref,
        held=origin.held,
    )
    if hold is not None:
        return (*held_job_status(hold), hold)
    group = planned.concurrency_group
    if gates.needs_group_check(group):
        assert group is not None
        await lock_group(conn, "job", origin.org_id, group, now)
        if await job_group_busy(conn, origin.org_id, group):
            gates.groups_taken.add(group)
    blocked = gates.gate(planned.job, group)
    if blocked is not None:
        return "pending", blocked, None
    gates.room = gates.room if gates.room is not None else await queue_room(conn)
    if not gates.take(planned.job, group):
        return "failed", None, None
    return "queued", None, None


async def supersede_run(conn: AsyncConnection, run_id: str, *, by: str) -> None:
    """Cancel an older run of a `cancel_in_progress` group (`superseded: run <id>`,
    docs/design/execution.md §8.3)."""
    reason = f"superseded: run {by}"
    await conn.execute(update(runs).where(runs.c.id == run_id).values(reason=reason))
    try:
        await cancel_run(conn, run_id, reason=reason, force=False, cancelled_by=f"run:{by}")
    except AlreadyFinished:
        pass


async def enqueue_job(
    conn: AsyncConnection, *, job_id: str, run_id: str, org_id: str, job: PlannedJob, now: Any
) -> None:
    """Add a job's `dispatch_queue` row (the only truth for what waits for an agent)."""
    await conn.execute(
        insert(dispatch_queue).values(
            job_id=job_id,
            run_id=run_id,
            org_id=org_id,
            state="pending",
            exact_labels=exact_labels_of(job.runs_on.model_dump(mode="json")),
            runs_on=job.runs_on.model_dump(mode="json"),
            enqueued_at=now,
            not_before=now,
        )
    )


async def _run_exists(conn: AsyncConnection, origin: RunOrigin, workflow: str) -> bool:
    if origin.delivery_id is not None:
        query = select(runs.c.id).where(runs.c.delivery_id == origin.delivery_id, runs.c.workflow == workflow)
    elif origin.event_id is not None:
        query = select(runs.c.id).where(
            runs.c.event_id == origin.event_id, runs.c.registration_id == origin.registration_id
        )
    elif origin.summon_key is not None:
        query = select(runs.c.id).where(runs.c.summon_key == origin.summon_key)
    else:
        return False
    return (await conn.execute(query)).first() is not None
