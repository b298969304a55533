"""The worker's service: held jobs, the answer to offers, cancels, and the coordinator side (relays, the
outbox, log catch-up, `event.emit`); the agent side is its adapters (`journal.py`, `dispatcher.py`,
`records.py`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from conveyor.cluster.drain import NodeDrain
from conveyor.cluster.messages import (
    TERMINAL_JOB_STATES,
    EventEmitRelay,
    EventEmitResultRelay,
    JobCancelRequest,
    JobProgress,
    JobProgressAck,
    JobReroute,
    JobRerouteAck,
    LogChunkRelay,
    ScalerEventRelay,
)
from conveyor.cluster.outbox import Outbox
from conveyor.cluster.reroute import RerouteAnswer, WorkerView, reroute_answer, worker_capacity
from conveyor.cluster.worker.dispatcher import WorkerDispatcher
from conveyor.cluster.worker.held import HeldJob
from conveyor.cluster.worker.journal import WorkerJournal
from conveyor.cluster.worker.logs import LogRelayBuffer, RelayedLogs
from conveyor.cluster.worker.records import WorkerRecords
from conveyor.cluster.worker.tokens import MemoryAgentTokens
from conveyor.execution.logs import masker_for
from conveyor.model import protocol as p
from conveyor.model.ids import format_rfc3339, utc_now

log = logging.getLogger(__name__)

TAKEN_BACK_REASONS = frozenset({"rerouted", "ack-timeout"})
RESEND_AFTER_S = 30.0
EMIT_TIMEOUT_S = 30.0
TERMINAL = frozenset({"success", "failed", "cancelled", "skipped", "timed_out"})


class WorkerService:
    """Held jobs, the agent side (journal, dispatcher, spawn records) and the coordinator side (relays)."""

    def __init__(
        self,
        *,
        instance_id: str,
        outbox: Outbox,
        peers: Any,
        inventory: Callable[[], tuple[list[Any], list[Any]]] = lambda: ([], []),
        drain: Any = None,
        dispatch_ack_timeout_ms: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.instance_id = instance_id
        self.outbox = outbox
        self.peers = peers  # PeerHub: sessions (coordinators), session_for()
        self.inventory = inventory
        # The node's `NodeDrain` (cluster.drain): its flag is read by the reroute answer and the heartbeat.
        self.drain = drain if drain is not None else NodeDrain()
        self.dispatch_ack_timeout_ms = dispatch_ack_timeout_ms
        self.clock = clock
        self.tokens = MemoryAgentTokens()
        self.jobs: dict[str, HeldJob] = {}
        self.dispatcher = WorkerDispatcher(self)
        self.journal = WorkerJournal(self)
        self.records = WorkerRecords(self)
        self.scaler_wake: Callable[[], None] = lambda: None
        self._emits: dict[str, asyncio.Future[EventEmitResultRelay]] = {}
        self._acked = asyncio.Event()  # set at each `job.progress.ack`
        # Log chunks of ended jobs that no coordinator could take yet (best effort, memory only).
        self.unsent_logs: dict[str, tuple[str | None, LogRelayBuffer]] = {}
        self.relayed_logs = RelayedLogs()
        # Jobs that ended here and whose result no coordinator has acknowledged yet: a second offer of one
        # (another coordinator's, while the first was frozen) is a duplicate, not a job to run again.
        self.ended_unacknowledged: set[str] = set()

    # --- what the drain code (docs/design/cluster.md §8) needs

    def held_jobs_not_started(self) -> list[str]:
        """Jobs accepted but not yet running on an agent."""
        return sorted(job.job_id for job in self.jobs.values() if job.state != "running")

    async def give_back(self, job_id: str, detail: str) -> bool:
        """Return a not-started job to its coordinator (`scaler.event {failed, final: true}`); whether it was held."""
        job = self.jobs.get(job_id)
        if job is None or job.state == "running":
            return False
        if job.agent_id is not None:
            await self._cancel_on_agent(job, "worker_giving_back")
        await self.relay(
            job,
            ScalerEventRelay(
                run_id=job.reroute.run_id,
                job_id=job_id,
                kind="failed",
                detail=detail,
                final=True,
                at=format_rfc3339(utc_now()),
            ),
        )
        self._drop(job)
        return True

    def running_jobs_count(self) -> int:
        """Jobs an agent is running (or was offered)."""
        return sum(1 for job in self.jobs.values() if job.state != "held")

    async def cancel_running(self, reason: str) -> int:
        """Ask each agent running a held job to cancel it (force); how many were asked."""
        count = 0
        for job in list(self.jobs.values()):
            if job.state != "held" and job.agent_id is not None:
                await self._cancel_on_agent(job, reason)
                count += 1
        return count

    async def flush_outbox(self, timeout_s: float) -> int:
        """Replay the outbox and wait up to `timeout_s` for its acks; how many entries are left."""
        await self.replay_outbox()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                while self.outbox.pending():
                    self._acked.clear()
                    await self._acked.wait()
        return len(self.outbox.pending())

    # --- coordinator messages

    async def handle(self, session: Any, message: Any) -> bool:
        """A message from a coordinator session; False when it is not a job-path message."""
        if session.peer_role != "coordinator":
            return False
        if isinstance(message, JobReroute):
            ack = self.accept(message, session.peer_id)
            await session.send(ack)
        elif isinstance(message, JobCancelRequest):
            await self.on_cancel(message)
        elif isinstance(message, JobProgressAck):
            if message.state in TERMINAL_JOB_STATES:
                self.relayed_logs.confirmed(message.job_id)
                self.ended_unacknowledged.discard(message.job_id)
            deleted = self.outbox.delete(message.job_id)
            self._acked.set()
            if deleted:
                log.info("coordinator %s acknowledged the result of job %s", session.peer_id, message.job_id)
        elif isinstance(message, EventEmitResultRelay):
            future = self._emits.pop(message.request_id, None)
            if future is not None and not future.done():
                future.set_result(message)
        else:
            return False
        return True

    def has_capacity(self, runs_on: Mapping[str, Any]) -> bool:
        """A matching free agent slot or free scaler room, after jobs already held and waiting."""
        agents, scalers = self.inventory()
        capacity = worker_capacity(runs_on, WorkerView(self.instance_id, True, False, agents, scalers))
        # Jobs accepted and still waiting for an agent already spoke for some of that room (those with a
        # spawn on its way are in the scaler's `active` count already).
        waiting = sum(1 for job in self.jobs.values() if job.state == "held" and job.bound_agent_id is None)
        return capacity.agent_slots + capacity.scaler_room > waiting

    def answer(self, message: JobReroute) -> RerouteAnswer:
        """`reroute_answer` over this worker's state."""
        return reroute_answer(
            me=self.instance_id,
            hop=message.hop,
            max_hops=message.max_hops,
            tried=message.tried,
            held=message.job_id in self.jobs or message.job_id in self.ended_unacknowledged,
            draining=self.drain.draining,
            has_capacity=self.has_capacity(message.labels.runs_on),
        )

    def accept(self, message: JobReroute, sender: str) -> JobRerouteAck:
        """Hold the job (or say why not); the ack to send."""
        answer = self.answer(message)
        if answer.accepted and not answer.duplicate:
            self.jobs[message.job_id] = HeldJob(message, owner=message.coordinator_id or sender)
            log.info(
                "accepted job %s from %s (hop %d)",
                message.job_id,
                sender,
                message.hop,
                extra={"job_id": message.job_id, "run_id": message.run_id},
            )
            self.dispatcher.wake()
            self.scaler_wake()
        elif not answer.accepted:
            log.info("refused job %s from %s: %s", message.job_id, sender, answer.reason)
        return JobRerouteAck(
            message_id=message.message_id,
            job_id=message.job_id,
            accepted=answer.accepted,
            duplicate=answer.duplicate,
            reason=answer.reason,
        )

    async def on_cancel(self, message: JobCancelRequest) -> None:
        """Stop a held job: drop it if no agent has it, else tell its agent."""
        job = self.jobs.get(message.job_id or "")
        if job is None:
            return
        # The coordinator took the job back (a lapsed window, a late ack): it expects no report.
        taken_back = message.reason in TAKEN_BACK_REASONS
        if job.agent_id is not None and job.state != "held":
            await self._cancel_on_agent(job, message.reason, force=message.force)
            if taken_back:
                self._drop(job)
        elif taken_back:
            self._drop(job)
        else:
            # A cancel before any agent took it: nothing else will report, so the worker does.
            progress = self.progress(job, "job", "cancelled", data={"reason": message.reason})
            await self.finish(job, progress)
        log.info("job %s cancelled by its coordinator: %s", message.job_id, message.reason)

    async def _cancel_on_agent(self, job: HeldJob, reason: str, *, force: bool = True) -> None:
        connection = self.dispatcher.agents.get(job.agent_id or "")
        if connection is not None:
            await connection.send(p.JobCancel(job_id=job.job_id, reason=reason, force=force))

    def _drop(self, job: HeldJob) -> None:
        job.erase()
        self.jobs.pop(job.job_id, None)
        self.dispatcher.wake()

    # --- sending to coordinators

    def coordinator_session(self, job_owner: str | None) -> Any:
        """The job's owner if connected, else any connected coordinator (docs/design/cluster.md §4.5), else
        None."""
        if job_owner is not None:
            session = self.peers.session_for(job_owner)
            if session is not None:
                return session
        for session in list(self.peers.sessions.values()):
            if session.peer_role == "coordinator":
                return session
        return None

    async def _catch_up(self, job_id: str, session: Any) -> None:
        """Send `session` the job's chunks that went on another session, before anything more of the job."""
        chunks = self.relayed_logs.behind(job_id, session)
        for chunk in chunks:
            await session.send(chunk)
        if chunks:
            self.relayed_logs.caught_up(job_id, session)

    async def relay(self, job: HeldJob, message: Any) -> bool:
        """Send to the job's coordinator; False when none is connected."""
        session = self.coordinator_session(job.owner)
        if session is None:
            return False
        try:
            await self._catch_up(job.job_id, session)
            await session.send(message)
        except Exception:
            return False
        return True

    async def relay_log(self, job: HeldJob, chunk: LogChunkRelay) -> None:
        """Send a chunk, or buffer it while no coordinator is connected (8 MiB per job)."""
        job.logs.add(chunk)
        await self.flush_logs(job)

    async def flush_logs(self, job: HeldJob) -> None:
        """Send a job's buffered chunks if a coordinator is connected."""
        await self._flush_buffer(job.job_id, job.owner, job.logs)

    async def _flush_buffer(self, job_id: str, owner: str | None, buffer: LogRelayBuffer) -> bool:
        """Send buffered chunks to the owner or any coordinator; whether the buffer is now empty."""
        session = self.coordinator_session(owner)
        if session is None:
            return False
        try:
            await self._catch_up(job_id, session)
        except Exception:
            return False
        marker = buffer.gap_marker()
        for chunk in buffer.drain():
            if marker is not None:
                chunk.lines.insert(0, marker)
                marker = None
            try:
                await session.send(chunk)
            except Exception:
                buffer.add(chunk)
            else:
                self.relayed_logs.sent(owner, chunk, session)
        return not buffer.chunks

    async def finish(self, job: HeldJob, progress: JobProgress) -> None:
        """Terminal progress: durable in the outbox first, then sent; the job's secrets are erased.

        Log lines still buffered (no coordinator connected) outlive the job until a coordinator
        connects: they are sent before the outbox is replayed.
        """
        await self.flush_logs(job)
        if job.logs.chunks or job.logs.dropped_lines:
            self.unsent_logs[job.job_id] = (job.owner, job.logs)
        message = progress.wire()
        await asyncio.to_thread(self.outbox.write, job.job_id, job.owner, message)
        self.ended_unacknowledged.add(job.job_id)
        self._drop(job)
        await self._send_outboxed(job.owner, message)

    async def _send_outboxed(self, owner: str | None, message: dict[str, Any]) -> None:
        session = self.coordinator_session(owner)
        if session is not None:
            with contextlib.suppress(Exception):
                await self._catch_up(str(message.get("job_id")), session)
                await session.send(message)

    async def replay_outbox(self, session: Any = None, *, older_than_s: float = 0.0) -> int:
        """Send every outbox entry (to `session`, else to each job's coordinator); how many were sent.

        Reading the outbox also prunes entries past 24 h. `older_than_s` skips entries written more
        recently (the periodic re-send leaves a just-sent result time to be acknowledged).
        """
        sent = 0
        now = self.outbox.clock()
        pending = await asyncio.to_thread(self.outbox.pending)
        self.relayed_logs.keep_only({entry.job_id for entry in pending} | set(self.jobs))
        self.ended_unacknowledged &= {entry.job_id for entry in pending}
        for entry in pending:
            if now - entry.written_at < older_than_s:
                continue
            target = session or self.coordinator_session(entry.owner)
            if target is None:
                continue
            try:
                await self._catch_up(entry.job_id, target)
                await target.send(entry.message)
                sent += 1
            except Exception:
                continue
        if sent:
            log.info("replayed %d result(s) from the outbox", sent)
        return sent

    async def resend_unacknowledged(self) -> int:
        """Periodic: re-send results still unacknowledged after `RESEND_AFTER_S` (a coordinator that
        failed to apply one keeps the session up, so no reconnect would replay it) and prune old ones."""
        return await self.replay_outbox(older_than_s=RESEND_AFTER_S)

    async def session_opened(self, session: Any) -> None:
        """A coordinator (re)connected: replay the outbox, send buffered logs."""
        if session.peer_role != "coordinator":
            return
        for job_id, owner in self.relayed_logs.owners():
            if self.coordinator_session(owner) is session:
                with contextlib.suppress(Exception):
                    await self._catch_up(job_id, session)
        for job_id, (owner, buffer) in list(self.unsent_logs.items()):
            if await self._flush_buffer(job_id, owner, buffer):
                self.unsent_logs.pop(job_id, None)
        await self.replay_outbox(session)
        for job in list(self.jobs.values()):
            await self.flush_logs(job)
            # A `running` progress is not durable: one lost while the link was down left the spawn window
            # armed, and the coordinator would take back a job that runs (docs/design/cluster.md §4.3).
            if job.state == "running" and self.coordinator_session(job.owner) is session:
                await session.send(self.progress(job, "job", "running", data={"agent_id": job.agent_id}))

    async def emit(self, job: HeldJob, message: p.EventEmit) -> p.EventEmitResult:
        """Relay an agent's `ctx.emit` and wait for the coordinator's answer."""
        future: asyncio.Future[EventEmitResultRelay] = asyncio.get_running_loop().create_future()
        self._emits[message.request_id] = future
        relay = EventEmitRelay(
            job_id=message.job_id,
            request_id=message.request_id,
            name=message.name,
            payload=masker_for(job.secret_values()).mask_json(message.payload),
            target_repos=message.target_repos,
        )
        if not await self.relay(job, relay):
            self._emits.pop(message.request_id, None)
            return p.EventEmitResult(
                request_id=message.request_id,
                error=p.EmitError(code="unavailable", detail="no coordinator is connected"),
            )
        try:
            async with asyncio.timeout(EMIT_TIMEOUT_S):
                result = await future
        except TimeoutError:
            self._emits.pop(message.request_id, None)
            return p.EventEmitResult(
                request_id=message.request_id,
                error=p.EmitError(code="unavailable", detail="the coordinator did not answer"),
            )
        return p.EventEmitResult(
            request_id=result.request_id,
            event_id=result.event_id,
            created=result.created,
            error=p.EmitError.model_validate(result.error) if result.error else None,
        )

    def progress(self, job: HeldJob, kind: str, state: str, **fields: Any) -> JobProgress:
        """A `job.progress` for one of our jobs, naming the attempt and hop of the offer this worker holds
        (unless `fields` names another attempt)."""
        fields.setdefault("attempt", job.reroute.attempt)
        fields.setdefault("hop", job.reroute.hop)
        return JobProgress(
            job_id=job.job_id,
            run_id=job.reroute.run_id,
            kind="job" if kind == "job" else "step",
            state=state,
            at=format_rfc3339(utc_now()),
            **fields,
        )

    def mask(self, job: HeldJob, lines: list[p.LogLine]) -> list[dict[str, Any]]:
        """Relayed lines with the job's secrets masked."""
        masker = masker_for(job.secret_values())
        return [{**line.model_dump(mode="json"), "text": masker.mask(line.text)} for line in lines]
