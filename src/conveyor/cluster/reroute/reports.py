"""Applying what workers report about the jobs they hold (docs/design/cluster.md §4.3, §4.5): progress
and results, relayed log chunks, `event.emit`, and scaler events (a spawn failure goes through Layer B).

Provenance is always the relaying session's authenticated instance id: only the job's holder's reports apply.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.cluster import store
from conveyor.cluster.messages import (
    EventEmitRelay,
    EventEmitResultRelay,
    JobCancelRequest,
    JobProgress,
    JobProgressAck,
    LogChunkRelay,
    ScalerEventRelay,
)
from conveyor.cluster.reroute.core import RerouteCore
from conveyor.cluster.reroute.policy import on_relayed_spawn_failure, worker_agent_id
from conveyor.execution.history import timeline
from conveyor.execution.lifecycle import (
    Effects,
    finish_job,
    lock_job_for_change,
    record_step,
    start_job,
)
from conveyor.execution.log_store import attempt_or_current
from conveyor.execution.logs import masker_for, named_attempt
from conveyor.model import protocol as p
from conveyor.model.ids import utc_now
from conveyor.model.masking import Masker
from conveyor.model.states import JOB_TERMINAL

log = logging.getLogger(__name__)


class ReportPart(RerouteCore):
    """The reroute service's side of what workers report."""

    async def _secrets(self, conn: AsyncConnection, job_id: str) -> list[str]:
        """The job's secret values (call only for a job the reporting worker holds: they are kept)."""
        values = self.job_secrets.get(job_id)
        if values is None and self.secret_values is not None:
            values = self.job_secrets[job_id] = await self.secret_values(conn, job_id)
        return values or []

    async def _masker(self, conn: AsyncConnection, job_id: str) -> Masker:
        """A masker of the job's secret values (as `_secrets`)."""
        return masker_for(tuple(await self._secrets(conn, job_id)))

    async def on_progress(self, sender: str, message: JobProgress) -> None:
        """Apply a worker's progress (guarded by `rerouted_to` = sender); ack terminal progress after commit."""
        effects: Effects | None = None
        at = _parse_time(message.at)
        async with self.db.transaction() as conn:
            await lock_job_for_change(conn, message.job_id)
            holder = await store.reroute_holder(conn, message.job_id)
            applies = (
                holder is not None and holder.rerouted_to == sender and holder.status not in JOB_TERMINAL
            )
            if not applies:
                log.info(
                    "progress %s of job %s from %s changed nothing (a replay, or not its holder)",
                    message.state,
                    message.job_id,
                    sender,
                    extra={"job_id": message.job_id},
                )
            elif message.terminal:
                masker = await self._masker(conn, message.job_id)
                for step in message.final_steps or []:
                    values = _step_values(step, masker)
                    await record_step(conn, message.job_id, int(step["step_index"]), **values)
                await _record_agent(conn, message.job_id, message.data.get("agent_id"))
                # Its "running" progress may have been lost: the end disarms the spawn window too.
                await store.disarm_reroute_window(conn, message.job_id)
                effects = await finish_job(
                    conn,
                    message.job_id,
                    message.state,
                    reason=message.data.get("reason"),
                    outputs=masker.mask_json(message.data.get("outputs")),
                    counted_attempt=await attempt_or_current(
                        conn, message.job_id, named_attempt(message.attempt, message.hop)
                    ),
                )
                log.info(
                    "applied the terminal result of job %s from worker %s: %s",
                    message.job_id,
                    sender,
                    message.state,
                    extra={"job_id": message.job_id},
                )
            elif message.kind == "job" and message.state == "running":
                assert holder is not None
                await store.disarm_reroute_window(conn, message.job_id)
                await start_job(conn, message.job_id, holder.agent_id or worker_agent_id(sender), at)
                await _record_agent(conn, message.job_id, message.data.get("agent_id"))
            elif message.kind == "step" and message.step_index is not None:
                masker = await self._masker(conn, message.job_id)
                await record_step(
                    conn,
                    message.job_id,
                    message.step_index,
                    **_step_values({**message.data, "status": message.state}, masker),
                    **({"started_at": at} if message.state == "running" else {"finished_at": at}),
                )
        if not applies and not message.terminal and holder is not None and holder.rerouted_to != sender:
            # A worker runs a job it does not hold (it accepted an offer that had timed out, or was taken
            # back while cut off): stop it there, as an agent's job owned by another gets `not_owned`.
            await self._send(
                sender,
                JobCancelRequest(run_id=holder.run_id, job_id=message.job_id, reason="rerouted", force=True),
            )
        if applies and (message.terminal or (message.kind == "job" and message.state == "running")):
            self.disarm_window(message.job_id)
        if message.terminal:
            self.job_secrets.pop(message.job_id, None)
            if self._withhold_acks > 0:
                self._withhold_acks -= 1
                log.warning("test hook: withheld the progress ack of job %s", message.job_id)
            else:
                await self._send(sender, JobProgressAck(job_id=message.job_id, state=message.state))
        self.on_job_changed(message.job_id)
        if effects is not None and self.on_effects is not None:
            await self.on_effects(effects)

    async def on_log_chunk(self, sender: str, chunk: LogChunkRelay) -> None:
        """Store a relayed chunk of a job this worker holds in its execution's log (duplicates by seq within
        the execution are dropped by the store)."""
        if self.append_log is None:
            return
        lines = [p.LogLine.model_validate(line) for line in chunk.lines]
        agent_chunk = p.LogChunk(
            job_id=chunk.job_id,
            step_index=chunk.step_index,
            seq=chunk.seq,
            lines=lines,
            attempt=chunk.attempt,
        )
        attempt = named_attempt(chunk.attempt, chunk.hop)
        async with self.db.transaction() as conn:
            holder = await store.reroute_holder(conn, chunk.job_id)
            if holder is None or holder.rerouted_to != sender:
                log.info(
                    "dropped a log chunk of job %s from %s, which does not hold it", chunk.job_id, sender
                )
                return
            await self.append_log(conn, agent_chunk, await self._secrets(conn, chunk.job_id), attempt)
        self.on_job_changed(chunk.job_id)

    async def on_event_emit(self, sender: str, emit: EventEmitRelay) -> None:
        """Relay a worker agent's `event.emit` to the event router; answer with `.result`."""
        async with self.db.read() as conn:
            holder = await store.reroute_holder(conn, emit.job_id)
            held = holder is not None and holder.rerouted_to == sender
            masker = await self._masker(conn, emit.job_id) if held else None
        emitter = self.event_emitter()
        if holder is None or holder.rerouted_to != sender:
            error: dict[str, Any] | None = {
                "code": "not_owned",
                "detail": "the job is not held by this worker",
            }
            result = EventEmitResultRelay(job_id=emit.job_id, request_id=emit.request_id, error=error)
        elif emitter is None:
            error = {"code": "events_disabled", "detail": "events are not enabled on this node"}
            result = EventEmitResultRelay(job_id=emit.job_id, request_id=emit.request_id, error=error)
        else:
            answer = await emitter(
                holder.agent_id or worker_agent_id(sender),
                p.EventEmit(
                    oseq=0,
                    request_id=emit.request_id,
                    job_id=emit.job_id,
                    name=emit.name,
                    payload=masker.mask_json(emit.payload) if masker is not None else {},
                    target_repos=emit.target_repos,
                ),
            )
            result = EventEmitResultRelay(
                job_id=emit.job_id,
                request_id=emit.request_id,
                event_id=answer.event_id,
                created=answer.created,
                error=answer.error.model_dump(mode="json") if answer.error else None,
            )
        await self._send(sender, result)

    async def on_scaler_event(self, sender: str, event: ScalerEventRelay) -> None:
        """A worker's scaler report for a rerouted job; a spawn failure goes through Layer B
        (docs/design/cluster.md §4.3).

        Provenance is `sender`, the relaying session's authenticated instance id, never a field of
        the message: only the job's holder's relays are recorded or acted on.
        """
        if event.kind != "failed":
            log.info("worker %s: %s for job %s: %s", sender, event.kind, event.job_id, event.detail)
            return
        async with self.db.read() as conn:
            known = await store.spawn_budget(conn, event.job_id)
        if known is None or known.rerouted_to != sender:
            log.info(
                "ignored a spawn failure of job %s relayed by %s, which does not hold it",
                event.job_id,
                sender,
            )
            return
        window_ms = (await self.settings(known.org_id)).spawn_window_ms
        attempt = f"attempt {event.attempt}" if event.attempt is not None else "a spawn attempt"
        error = f"worker {sender}: {attempt} failed: {event.detail}"
        async with self.db.transaction() as conn:
            await lock_job_for_change(conn, event.job_id)
            now = await store.database_now(conn)
            budget = await store.spawn_budget(conn, event.job_id)
            if budget is None:
                return
            verdict = on_relayed_spawn_failure(
                sender=sender,
                holder=budget.rerouted_to,
                status=budget.status,
                window_expires_at=budget.window_expires_at,
                final=event.final,
                failures=budget.failures,
                max_attempts=budget.max_attempts,
                backoff_ms=budget.backoff_ms,
                spawn_window_ms=window_ms,
                now=now,
            )
            if verdict.action != "ignore":
                await store.record_spawn_failure(conn, event.job_id, error)
                await timeline(
                    conn,
                    budget.run_id,
                    event.job_id,
                    "scaler",
                    "scaler.failed",
                    {"worker": sender, "attempt": event.attempt, "final": event.final, "error": event.detail},
                )
            if verdict.failures is not None:
                await store.count_spawn_failure(
                    conn,
                    event.job_id,
                    sender,
                    failures=verdict.failures,
                    window_expires_at=verdict.window_expires_at,
                )
        log.info("job %s: %s (%s)", event.job_id, error, verdict.action, extra={"job_id": event.job_id})
        if verdict.action == "rearm" and verdict.window_expires_at is not None:
            self.arm_window(event.job_id, sender, (verdict.window_expires_at - now).total_seconds())
        elif verdict.action == "redispatch":
            why = "gave the job back" if verdict.reason == "final" else "spawn attempts used up"
            await self.redispatch(event.job_id, sender, verdict.reason or "final", f"{why}: {event.detail}")


async def _record_agent(conn: AsyncConnection, job_id: str, agent_id: Any) -> None:
    """Name the worker's agent that runs the job (the claim named only the worker)."""
    if isinstance(agent_id, str) and agent_id:
        await store.set_job_agent(conn, job_id, agent_id[:64])


_STEP_FIELDS = (
    "name",
    "kind",
    "lock_index",
    "status",
    "reason",
    "exit_code",
    "outputs",
    "attempts",
    "error",
    "duration_ms",
)


def _step_values(step: Mapping[str, Any], masker: Masker) -> dict[str, Any]:
    """The `steps` columns a progress message may set, its outputs and error masked."""
    values = {name: step[name] for name in _STEP_FIELDS if step.get(name) is not None}
    if "outputs" in values:
        values["outputs"] = masker.mask_json(values["outputs"])
    if "error" in values:
        values["error"] = masker.mask(str(values["error"]))
    return values


def _parse_time(value: str) -> datetime:
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return utc_now()
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
