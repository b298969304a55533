"""Leader-only sweeps (docs/design/execution.md §8.4): recovery, cancel deadlines, unschedulable jobs,
workflow timeouts.

Every action is a guarded write, so a concurrent finish wins or loses cleanly.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from prometheus_client import Counter
from sqlalchemy import null, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.db.tables import agents, dispatch_queue, jobs, runs
from conveyor.execution.approvals import expire_held
from conveyor.execution.cancel import cancel_run
from conveyor.execution.history import timeline
from conveyor.execution.lifecycle import Effects, finish_job
from conveyor.execution.lifecycle import _report as report_status
from conveyor.execution.queue import AgentSlot, agent_can_take, record_wait_note, requeue
from conveyor.execution.transitions import transition
from conveyor.model.ids import utc_now
from conveyor.model.states import JOB_TERMINAL
from conveyor.parts import PartKey
from conveyor.runtime import store as instance_store

STALE_JOBS = Counter("conveyor_stale_jobs_detected_total", "Jobs whose agent stopped heartbeating")


def describe_labels(runs_on: dict[str, Any]) -> str:
    """`[gpu, linux]` from a stored `runs_on` (globs and regexes shown as written)."""
    return "[" + ", ".join(m["pattern"] for m in runs_on.get("labels", [])) + "]"


def classify_pending(runs_on: dict[str, Any], online: list[AgentSlot], draining: set[str]) -> str:
    """Why a pending row waits (pure): `unschedulable: …` when nothing could ever take it, else `waiting: …`."""
    matching = [agent for agent in online if agent_can_take(runs_on, agent)]
    if not matching:
        return f"unschedulable: no connected agent or scaler matches {describe_labels(runs_on)}"
    if all(agent.agent_id in draining for agent in matching):
        return "unschedulable: every matching agent is draining"
    return f"waiting: {len(matching)} matching agent{'s' if len(matching) != 1 else ''} busy"


UNSCHEDULABLE = "unschedulable: "


def pending_note(local: str, scaler: str | None, worker: str | None, reroute_tried: list[str] | None) -> str:
    """A pending row's note from every say (pure): local agents (`classify_pending`), then a local
    scaler, then a connected worker. A row rerouting handed back (`reroute_tried` set: the
    coordinator, then the workers offered it) is for local capacity only, so no worker may speak for
    it and its note names the workers tried, as will its `unroutable` reason."""
    if not local.startswith(UNSCHEDULABLE):
        return local
    if scaler:
        return scaler
    if reroute_tried is None:
        return worker or local
    return f"{local} (workers tried: {', '.join(reroute_tried[1:]) or 'none'})"


def unroutable_reason(note: str, since: datetime | None, now: datetime, grace: timedelta) -> str | None:
    """`unroutable: …` once a row has been unschedulable for the grace (at once with a zero grace), else None."""
    if not note.startswith(UNSCHEDULABLE) or now - (since or now) < grace:
        return None
    return "unroutable: " + note.removeprefix(UNSCHEDULABLE)


async def _zero(*_: Any) -> int:
    return 0


@dataclass
class SweepSettings:
    """What the sweeps need to know (knobs are read per sweep, so a settings change applies at once)."""

    unroutable_grace_ms: Callable[[], Awaitable[int]]
    # `queue_timeout_ms` of an org (0 = never).
    queue_timeout_ms: Callable[[str], Awaitable[int]] = _zero
    # `concurrency_wait_timeout_ms` (0 = never).
    concurrency_wait_timeout_ms: Callable[[], Awaitable[int]] = _zero
    # `held_run_retention_days` (0 = never): jobs waiting for approval longer are cancelled.
    held_run_retention_days: Callable[[], Awaitable[int]] = _zero
    # Silence after which an agent connected nowhere has lost its jobs (`CONVEYOR_AGENT_DEAD_AFTER_MS`).
    dead_after_ms: int = 45_000
    recovery_grace_ms: int = 120_000
    max_attempts: int = 5
    # How long a coordinator's `cluster_instances` row stays live without a heartbeat.
    instance_window: timedelta = timedelta(seconds=30)
    # The scaler's say (wired at start-up): a `waiting: …` note when some scaler can serve the job
    # (job id, runs_on), so a job only a spawned agent can take is never unschedulable nor unroutable.
    scalable: Callable[[str, dict[str, Any]], str | None] | None = None
    # The cluster's say (wired at start-up, docs/design/cluster.md §4.1): a `waiting: worker W …` note when a
    # connected worker can run the job (runs_on); never asked for a row rerouting handed back.
    worker_note: Callable[[dict[str, Any]], str | None] | None = None
    # The cluster's say (wired at start-up, docs/design/cluster.md §4.5): whether a job rerouted to this
    # worker is left alone because the worker is connected or was heard from within `reroute_flap_grace_ms`. A
    # worker's agents are never in the `agents` table, so without it they look connected nowhere.
    rerouted_job_deferred: Callable[[str], Awaitable[bool]] | None = None


HeartbeatVerdict = Literal["requeue", "recover"]


def heartbeat_verdict(
    status: str, last_seen: datetime | None, now: datetime, dead_after: timedelta, connected: bool
) -> HeartbeatVerdict | None:
    """What the heartbeat check does with a `dispatched`/`running` job (pure, docs/design/execution.md §8.4).

    Only a job whose agent is connected nowhere and silent past `dead_after` is touched: before
    `job.started` it is requeued; after, it goes `recovering` (steps may have had side effects).
    """
    if connected or status not in ("dispatched", "running"):
        return None
    if last_seen is not None and now - last_seen < dead_after:
        return None
    return "requeue" if status == "dispatched" else "recover"


def queue_timeout_reason(note: str | None, provisioning_error: str | None) -> str:
    """`queue_timeout: <last unschedulable text or provisioning error>` (or the bare code)."""
    detail = note or provisioning_error
    return f"queue_timeout: {detail}" if detail else "queue_timeout"


async def sweep(conn: AsyncConnection, settings: SweepSettings, now: datetime | None = None) -> list[Effects]:
    """One pass of every check; returns the effects to act on after commit."""
    now = now or utc_now()
    results: list[Effects] = []
    results.extend(await heartbeat_check(conn, settings, now))
    recovering = await conn.execute(
        select(jobs.c.id).where(jobs.c.status == "recovering", jobs.c.recovery_deadline < now)
    )
    for (job_id,) in list(recovering):
        results.append(
            await finish_job(conn, job_id, "failed", reason="agent_lost", queue_outcome="agent_lost")
        )
    unconfirmed = await conn.execute(
        select(jobs.c.id).where(jobs.c.status == "cancelling", jobs.c.cancel_deadline < now)
    )
    for (job_id,) in list(unconfirmed):
        results.append(
            await finish_job(
                conn, job_id, "cancelled", reason="cancel_unconfirmed", queue_outcome="cancelled"
            )
        )
    overdue = await conn.execute(
        select(runs.c.id).where(
            runs.c.status.in_(["pending", "queued", "running"]),
            runs.c.deadline_at.is_not(None),
            runs.c.deadline_at < now,
        )
    )
    for (run_id,) in list(overdue):
        await conn.execute(update(runs).where(runs.c.id == run_id).values(reason="workflow_timeout"))
        outcome = await cancel_run(
            conn, run_id, reason="workflow_timeout", force=True, cancelled_by="workflow_timeout"
        )
        results.extend(outcome.effects)
    results.extend(await expire_queue(conn, settings, now))
    results.extend(await classify_queue(conn, settings, now))
    results.extend(await concurrency_waits(conn, settings, now))
    results.extend(await expire_held(conn, await settings.held_run_retention_days(), now))
    return results


async def heartbeat_check(conn: AsyncConnection, settings: SweepSettings, now: datetime) -> list[Effects]:
    """Jobs of agents connected nowhere whose heartbeats stopped: requeued, or `recovering` (full grace).

    An agent is connected when its row is online or draining on a coordinator whose instance row is
    live; the coordinator holding a live connection closes a silent one itself (4004).
    """
    candidates = list(
        await conn.execute(
            select(
                jobs.c.id,
                jobs.c.status,
                jobs.c.agent_id,
                jobs.c.rerouted_to,
                jobs.c.reroute_hop,
                jobs.c.last_heartbeat_at,
                jobs.c.started_at,
                dispatch_queue.c.claimed_at,
                agents.c.state.label("agent_state"),
                agents.c.instance_id.label("agent_instance"),
            )
            .select_from(
                jobs.outerjoin(dispatch_queue, dispatch_queue.c.job_id == jobs.c.id).outerjoin(
                    agents, agents.c.agent_id == jobs.c.agent_id
                )
            )
            # A fan-out job has no agent of its own: its hosts are swept (docs/design/execution.md §13).
            .where(jobs.c.status.in_(["dispatched", "running"]), jobs.c.fanout.is_(False))
        )
    )
    if not candidates:
        return []
    database_now = await instance_store.database_now(conn)
    live = {
        row.instance_id
        for row in await instance_store.list_instances(conn)
        if database_now - row.last_heartbeat_at <= settings.instance_window
    }
    dead_after = timedelta(milliseconds=settings.dead_after_ms)
    results: list[Effects] = []
    for row in candidates:
        if row.rerouted_to is not None:
            results.extend(await _rerouted_job_check(conn, settings, row, now))
            continue
        connected = row.agent_state in ("online", "draining") and row.agent_instance in live
        last_seen = row.last_heartbeat_at or row.claimed_at or row.started_at
        verdict = heartbeat_verdict(row.status, last_seen, now, dead_after, connected)
        if verdict is None:
            continue
        STALE_JOBS.inc()
        if verdict == "requeue":
            effects = await requeue(
                conn,
                row.id,
                outcome="agent_lost",
                detail="no heartbeat and the agent is connected nowhere",
                now=now,
                max_attempts=settings.max_attempts,
                agent_id=row.agent_id,
            )
            if effects is not None:
                results.append(effects)
        else:
            deadline = now + timedelta(milliseconds=settings.recovery_grace_ms)
            await transition(
                conn, "job", row.id, "recovering", only_from={"running"}, recovery_deadline=deadline
            )
    return results


async def _rerouted_job_check(
    conn: AsyncConnection, settings: SweepSettings, row: Any, now: datetime
) -> list[Effects]:
    """A rerouted job: left alone while its worker is connected or within the flap grace; otherwise
    (a forgotten, unknown or longer-silent worker) a not-started job is requeued and a started one
    ends `timed_out`, reason `stale`, so nothing hangs forever (docs/design/cluster.md §4.5)."""
    if settings.rerouted_job_deferred is not None and await settings.rerouted_job_deferred(row.rerouted_to):
        return []
    STALE_JOBS.inc()
    await conn.execute(
        update(jobs)
        .where(jobs.c.id == row.id, jobs.c.rerouted_to == row.rerouted_to)
        # A requeued job is a fresh dispatch: any worker may take it again (SQL NULL, not JSON null).
        .values(rerouted_to=None, reroute_window_expires_at=None, reroute_tried=null())
    )
    if row.status == "dispatched":
        effects = await requeue(
            conn,
            row.id,
            outcome="agent_lost",
            detail=f"worker {row.rerouted_to} was not heard from within the flap grace",
            now=now,
            max_attempts=settings.max_attempts,
            agent_id=row.agent_id,
            reason="flap-grace",
            reroute_hop=row.reroute_hop,
        )
        return [effects] if effects is not None else []
    return [await finish_job(conn, row.id, "timed_out", reason="stale", queue_outcome="agent_lost")]


async def expire_queue(conn: AsyncConnection, settings: SweepSettings, now: datetime) -> list[Effects]:
    """Stamp `expires_at` on new rows from their org's `queue_timeout_ms`; time out pending rows past it."""
    unstamped = list(
        await conn.execute(
            select(dispatch_queue.c.job_id, dispatch_queue.c.org_id, dispatch_queue.c.enqueued_at).where(
                dispatch_queue.c.expires_at.is_(None)
            )
        )
    )
    timeouts: dict[str, int] = {}
    for job_id, org_id, enqueued_at in unstamped:
        if org_id not in timeouts:
            timeouts[org_id] = await settings.queue_timeout_ms(org_id)
        if timeouts[org_id] > 0:
            await conn.execute(
                update(dispatch_queue)
                .where(dispatch_queue.c.job_id == job_id)
                .values(expires_at=enqueued_at + timedelta(milliseconds=timeouts[org_id]))
            )
    expired = list(
        await conn.execute(
            select(
                dispatch_queue.c.job_id,
                dispatch_queue.c.unschedulable,
                dispatch_queue.c.last_provisioning_error,
            ).where(
                dispatch_queue.c.state == "pending",
                dispatch_queue.c.expires_at.is_not(None),
                dispatch_queue.c.expires_at <= now,
            )
        )
    )
    results: list[Effects] = []
    for job_id, note, provisioning_error in expired:
        reason = queue_timeout_reason(note, provisioning_error)
        results.append(
            await finish_job(
                conn, job_id, "timed_out", reason=reason, queue_outcome="expired", only_from={"queued"}
            )
        )
    return results


async def concurrency_waits(conn: AsyncConnection, settings: SweepSettings, now: datetime) -> list[Effects]:
    """Runs and jobs waiting for a group past `concurrency_wait_timeout_ms`
    (docs/design/execution.md §8.3)."""
    timeout_ms = await settings.concurrency_wait_timeout_ms()
    if timeout_ms <= 0:
        return []
    cutoff = now - timedelta(milliseconds=timeout_ms)
    results: list[Effects] = []
    waiting_runs = await conn.execute(
        select(runs.c.id).where(runs.c.status == "pending", runs.c.created_at <= cutoff)
    )
    for (run_id,) in list(waiting_runs):
        results.append(await fail_waiting_run(conn, run_id, now))
    waiting_jobs = await conn.execute(
        select(jobs.c.id).where(
            jobs.c.status == "pending",
            jobs.c.blocked_on == "concurrency",
            jobs.c.blocked_since.is_not(None),
            jobs.c.blocked_since <= cutoff,
        )
    )
    for (job_id,) in list(waiting_jobs):
        results.append(
            await finish_job(
                conn, job_id, "timed_out", reason="concurrency_wait_timeout", queue_outcome="expired"
            )
        )
    return results


async def fail_waiting_run(conn: AsyncConnection, run_id: str, now: datetime) -> Effects:
    """A run that waited too long for its group: `failed`, its jobs `cancelled` (nothing ever ran)."""
    effects = Effects()
    reason = "concurrency_wait_timeout"
    if await transition(
        conn, "run", run_id, "failed", only_from={"pending"}, reason=reason, finished_at=now
    ) != ("changed"):
        return effects
    effects.finished_runs.append(run_id)
    await report_status(conn, run_id, None, "failed")
    await timeline(conn, run_id, None, "dispatch", "run.finished", {"status": "failed", "reason": reason})
    unfinished = await conn.execute(
        select(jobs.c.id).where(jobs.c.run_id == run_id, jobs.c.status.not_in(sorted(JOB_TERMINAL)))
    )
    for (job_id,) in list(unfinished):
        await finish_job(conn, job_id, "cancelled", reason=reason, queue_outcome="cancelled")
    return effects


async def classify_queue(conn: AsyncConnection, settings: SweepSettings, now: datetime) -> list[Effects]:
    """Write each pending row's waiting/unschedulable note; fail rows unschedulable past the grace."""
    online_rows = await conn.execute(
        select(agents.c.agent_id, agents.c.labels, agents.c.mandatory_labels, agents.c.state).where(
            agents.c.state.in_(["online", "draining"])
        )
    )
    online: list[AgentSlot] = []
    draining: set[str] = set()
    for row in online_rows:
        online.append(AgentSlot(row.agent_id, tuple(row.labels), tuple(row.mandatory_labels)))
        if row.state == "draining":
            draining.add(row.agent_id)
    grace = timedelta(milliseconds=await settings.unroutable_grace_ms())
    results: list[Effects] = []
    pending = await conn.execute(
        select(
            dispatch_queue.c.job_id,
            dispatch_queue.c.runs_on,
            dispatch_queue.c.unschedulable_since,
            jobs.c.reroute_tried,
        )
        .select_from(dispatch_queue.outerjoin(jobs, jobs.c.id == dispatch_queue.c.job_id))
        .where(dispatch_queue.c.state == "pending")
    )
    for job_id, runs_on, since, tried in list(pending):
        note = classify_pending(runs_on, online, draining)
        if note.startswith(UNSCHEDULABLE):
            scaler = settings.scalable(job_id, runs_on) if settings.scalable is not None else None
            worker = settings.worker_note(runs_on) if settings.worker_note is not None else None
            note = pending_note(note, scaler, worker, tried)
        reason = unroutable_reason(note, since, now, grace)
        if reason is not None:
            results.append(
                await finish_job(conn, job_id, "failed", reason=reason, queue_outcome="unroutable")
            )
            continue
        await record_wait_note(conn, job_id, note, (since or now) if note.startswith(UNSCHEDULABLE) else None)
    return results


SWEEP_SETTINGS = PartKey[SweepSettings]("sweep_settings")
"""The leader sweep's settings, published by the agents hook; the scaler and cluster hooks add their rules."""
