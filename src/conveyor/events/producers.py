"""Producers plugged into other packages by the server (they never import `events`): step emits,
completion events in the terminal transactions, registration sync on pushes, generic webhooks."""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.db.engine import Database
from conveyor.db.tables import environments, jobs, runs, steps
from conveyor.events.emit import emit_in_tx, emit_system
from conveyor.events.global_eval import GlobalEvaluator, GlobalRound
from conveyor.events.metrics import EventMetrics
from conveyor.events.models import (
    APPROVAL_REQUESTED,
    GENERIC_WEBHOOK,
    JOB_COMPLETE,
    WORKFLOW_COMPLETE,
    EmitRejected,
    EmitRequest,
    EventSettings,
)
from conveyor.events.notify import ApprovalWait, run_url
from conveyor.events.notify_delivery import emit_for_approval, emit_for_run_end
from conveyor.events.registrations import global_sources_for, replace_all
from conveyor.events.service import EventService
from conveyor.ingest.pipeline import DeliveryPipeline
from conveyor.lockfile import Lock
from conveyor.model import protocol as p
from conveyor.model.approvals import protection_of
from conveyor.model.states import JOB_TERMINAL, RUN_TERMINAL

log = logging.getLogger(__name__)


def _duration_ms(started: Any, finished: Any) -> int | None:
    if started is None or finished is None:
        return None
    return int((finished - started).total_seconds() * 1000)


def _run_status(status: str) -> str:
    return status if status in ("success", "failed", "cancelled") else "failed"


class EventProducers:
    """What the server injects into execution, agents and ingest."""

    def __init__(
        self, db: Database, settings: EventSettings, metrics: EventMetrics, service: EventService
    ) -> None:
        self.db = db
        self._initial_settings = settings
        self.metrics = metrics
        self.service = service
        self._installed: list[tuple[Any, str, Any]] = []
        # Set by the events hook: the evaluation of global workflows (docs/design/global_workflows.md §4).
        self.global_evaluator: GlobalEvaluator | None = None

    @property
    def settings(self) -> EventSettings:
        """The router's current settings (live knob values)."""
        return self.service.settings

    # --- wiring

    def install(self, *, agent_hub: object | None, pipeline: DeliveryPipeline | None) -> None:
        """Plug the producers in (undone by `uninstall`): the terminal and waiting hooks of `execution`, the agent
        hub's step events (`event_emitter`; the hub is a sibling package's, so `server` hands it in), and the
        ingest pipeline's."""
        from conveyor.execution import holds, transitions

        transitions.TERMINAL_HOOKS.append(self.on_terminal)
        holds.WAITING_HOOKS.append(self.on_waiting)
        if agent_hub is not None:
            self._set(agent_hub, "event_emitter", self.step_emit)
        if pipeline is not None:
            self._set(pipeline, "events", self)

    def _set(self, target: Any, name: str, value: Any) -> None:
        self._installed.append((target, name, getattr(target, name, None)))
        setattr(target, name, value)

    def uninstall(self) -> None:
        """Remove the hooks."""
        from conveyor.execution import holds, transitions

        if self.on_terminal in transitions.TERMINAL_HOOKS:
            transitions.TERMINAL_HOOKS.remove(self.on_terminal)
        if self.on_waiting in holds.WAITING_HOOKS:
            holds.WAITING_HOOKS.remove(self.on_waiting)
        for target, name, previous in reversed(self._installed):
            setattr(target, name, previous)
        self._installed.clear()

    # --- completions (same transaction as the terminal status)

    async def on_terminal(self, conn: AsyncConnection, entity: str, row_id: str, status: str) -> None:
        """`__workflow_complete` / `__job_complete` for a run or job that just became terminal."""
        if entity == "run" and status in RUN_TERMINAL:
            await self._workflow_complete(conn, row_id)
        elif entity == "job" and status in JOB_TERMINAL:
            await self._job_complete(conn, row_id)

    async def on_waiting(self, conn: AsyncConnection, job_id: str) -> None:
        """`conveyor.approval.requested` for a job that just started waiting (docs/design/approvals.md §5)."""
        row = (
            await conn.execute(
                select(
                    jobs,
                    runs.c.number,
                    runs.c.workflow,
                    runs.c.repo,
                    runs.c.routing_key,
                    runs.c.ref,
                    runs.c.sha,
                )
                .join(runs, runs.c.id == jobs.c.run_id)
                .where(jobs.c.id == job_id)
            )
        ).first()
        if row is None:
            return
        rule = (
            await conn.execute(
                select(environments.c.protection).where(
                    environments.c.org_id == row.org_id, environments.c.name == row.environment
                )
            )
        ).scalar_one_or_none()
        protection = protection_of(rule)
        await emit_system(
            conn,
            EmitRequest(
                name=APPROVAL_REQUESTED,
                origin="system",
                org_id=row.org_id,
                payload={
                    "run_id": row.run_id,
                    "run_number": row.number,
                    "job_id": job_id,
                    "job_name": row.name,
                    "display_name": row.display_name,
                    "workflow": row.workflow,
                    "repo": row.repo,
                    "routing_key": row.routing_key,
                    "ref": row.ref,
                    "sha": row.sha,
                    "environment": row.environment,
                    "approvers": list(protection.approvers) if protection is not None else [],
                    "reason": row.reason,
                    "url": run_url(self.settings.public_url, row.run_id),
                },
                source_routing_key=row.routing_key,
                source_repo=row.repo,
                source_run_id=row.run_id,
                # A request to people starts no chain.
                chain_depth=0,
                dedup_key=f"ar:{job_id}:{row.blocked_since.isoformat() if row.blocked_since else ''}",
            ),
            self.settings,
        )
        waiting = ApprovalWait(
            run_id=row.run_id,
            job_id=job_id,
            job=row.display_name,
            environment=row.environment,
            approvers=tuple(protection.approvers) if protection is not None else (),
            since=row.blocked_since.isoformat() if row.blocked_since else "",
        )
        # A savepoint, as for a run's end: a failure with the rules must not undo the job's wait.
        try:
            async with conn.begin_nested():
                await emit_for_approval(conn, waiting, self.settings)
        except Exception:
            log.exception("approval notifications for job %s not emitted", job_id)

    async def _workflow_complete(self, conn: AsyncConnection, run_id: str) -> None:
        run = (await conn.execute(select(runs).where(runs.c.id == run_id))).first()
        if run is None or run.workflow == "conveyor.lock":
            return
        job_rows = await conn.execute(
            select(jobs.c.name, jobs.c.status, jobs.c.outputs)
            .where(jobs.c.run_id == run_id)
            .order_by(jobs.c.created_at)
        )
        status = _run_status(run.status)
        payload: dict[str, Any] = {
            "run_id": run.id,
            "workflow_name": run.workflow,
            "repo": run.repo,
            "routing_key": run.routing_key,
            "status": status,
            "duration_ms": _duration_ms(run.started_at or run.created_at, run.finished_at),
            "jobs": [{"name": j.name, "status": j.status, "outputs": j.outputs or {}} for j in job_rows],
        }
        if status == "failed":
            payload["failure_class"] = (run.reason or "job_failed").split(":")[0][:100]
        await emit_system(
            conn,
            EmitRequest(
                name=WORKFLOW_COMPLETE,
                origin="system",
                org_id=run.org_id,
                payload=payload,
                source_routing_key=run.routing_key,
                source_repo=run.repo,
                source_run_id=run.id,
                chain_depth=int(run.chain_depth or 0) + 1,
                dedup_key=f"wc:{run.id}",
            ),
            self.settings,
        )
        await self._notifications(conn, run)

    async def _notifications(self, conn: AsyncConnection, run: Any) -> None:
        # A savepoint: whatever goes wrong with the rules must not roll back the run's terminal status.
        try:
            async with conn.begin_nested():
                await emit_for_run_end(conn, run, self.settings)
        except Exception:
            log.exception("notifications for run %s not emitted", run.id)

    async def _job_complete(self, conn: AsyncConnection, job_id: str) -> None:
        row = (
            await conn.execute(
                select(jobs, runs.c.workflow, runs.c.repo, runs.c.routing_key, runs.c.chain_depth)
                .join(runs, runs.c.id == jobs.c.run_id)
                .where(jobs.c.id == job_id)
            )
        ).first()
        if row is None:
            return
        step_rows = await conn.execute(
            select(steps.c.name, steps.c.status, steps.c.duration_ms)
            .where(steps.c.job_id == job_id)
            .order_by(steps.c.step_index)
        )
        await emit_system(
            conn,
            EmitRequest(
                name=JOB_COMPLETE,
                origin="system",
                org_id=row.org_id,
                payload={
                    "run_id": row.run_id,
                    "job_id": job_id,
                    "workflow_name": row.workflow,
                    "job_name": row.name,
                    "repo": row.repo,
                    "routing_key": row.routing_key,
                    "status": row.status,
                    "duration_ms": _duration_ms(row.started_at, row.finished_at),
                    "steps": [
                        {"name": s.name, "status": s.status, "duration_ms": s.duration_ms} for s in step_rows
                    ],
                },
                source_routing_key=row.routing_key,
                source_repo=row.repo,
                source_run_id=row.run_id,
                source_job_id=job_id,
                chain_depth=int(row.chain_depth or 0) + 1,
                dedup_key=f"jc:{job_id}",
            ),
            self.settings,
        )

    # --- ctx.emit from a step (agent protocol)

    async def step_emit(self, agent_id: str, message: p.EventEmit) -> p.EventEmitResult:
        """Insert the step's event (dedup `emit:<job_id>:<request_id>`); answer after commit."""
        try:
            async with self.db.transaction() as conn:
                row = (
                    await conn.execute(
                        select(
                            jobs.c.agent_id,
                            jobs.c.status,
                            runs.c.id.label("run_id"),
                            runs.c.org_id,
                            runs.c.routing_key,
                            runs.c.repo,
                            runs.c.chain_depth,
                        )
                        .join(runs, runs.c.id == jobs.c.run_id)
                        .where(jobs.c.id == message.job_id)
                    )
                ).first()
                dedup = f"emit:{message.job_id}:{message.request_id}"
                if row is None or row.agent_id != agent_id or row.status != "running":
                    # A resend of an emit that already committed still gets its id.
                    from conveyor.db.tables import events

                    existing = (
                        await conn.execute(select(events.c.id).where(events.c.dedup_key == dedup))
                    ).scalar_one_or_none()
                    if existing is not None and row is not None and row.agent_id == agent_id:
                        return p.EventEmitResult(
                            request_id=message.request_id, event_id=existing, created=False
                        )
                    raise EmitRejected("not_job_owner", f"job {message.job_id} is not running on this agent")
                result = await emit_in_tx(
                    conn,
                    EmitRequest(
                        name=message.name,
                        origin="custom",
                        org_id=row.org_id,
                        payload=message.payload,
                        source_routing_key=row.routing_key,
                        source_repo=row.repo,
                        source_run_id=row.run_id,
                        source_job_id=message.job_id,
                        target_repos=message.target_repos or None,
                        chain_depth=int(row.chain_depth or 0) + 1,
                        dedup_key=dedup,
                    ),
                    self.settings,
                )
        except EmitRejected as exc:
            return p.EventEmitResult(
                request_id=message.request_id,
                error=p.EmitError(code=exc.code, detail=exc.detail, retry_after_ms=exc.retry_after_ms),
            )
        self.service.wake()
        return p.EventEmitResult(
            request_id=message.request_id, event_id=result.event_id, created=result.created
        )

    # --- ingest

    async def sync_push(self, conn: AsyncConnection, source: Any, commit_sha: str | None, lock: Lock) -> None:
        """Replace-all sync of a default-branch push's registrations (prune=True)."""
        repo = source.name if source.kind == "local" else source.repo
        try:
            async with conn.begin_nested():
                global_sources = await global_sources_for(conn, source.org_id, lock)
                await replace_all(
                    conn,
                    org_id=source.org_id,
                    routing_key=source.routing_key,
                    repo=repo,
                    lock=lock,
                    commit_sha=commit_sha,
                    default_branch=source.default_branch,
                    prune=True,
                    mode="push",
                    settings=self.settings,
                    global_sources=global_sources,
                )
        except Exception:
            self.metrics.registration_syncs.labels("push", "failed").inc()
            log.exception("registration sync of %s failed", source.routing_key)
            return
        self.metrics.registration_syncs.labels("push", "ok").inc()

    async def global_round(self, source: Any, event: Any) -> GlobalRound | None:
        """The global workflows a delivery of `source` runs (None: its org has no policy sources)."""
        if self.global_evaluator is None:
            return None
        return await self.global_evaluator.evaluate(source.org_id, source.routing_key, event)

    def sync_skipped(self) -> None:
        """A default-branch push whose lock was missing or invalid: nothing changed."""
        self.metrics.registration_syncs.labels("push", "skipped").inc()

    async def generic_delivery(
        self, conn: AsyncConnection, source: Any, delivery_id: str, parsed: Any
    ) -> None:
        """`__generic_webhook` for a `generic` source's delivery (dedup `gw:<delivery id>`)."""
        await emit_system(
            conn,
            EmitRequest(
                name=GENERIC_WEBHOOK,
                origin="system",
                org_id=source.org_id,
                payload={"source": source.name, "event": parsed.action, "body": parsed.payload},
                source_routing_key=source.routing_key,
                dedup_key=f"gw:{delivery_id}",
            ),
            self.settings,
        )
