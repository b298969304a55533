"""Worker mode (docs/design/cluster.md §1, §4): a database-less node that runs rerouted jobs on its own
agents.

The worker reuses the agent hub (`conveyor.agents.hub.AgentHub`) and the scaler manager
(`conveyor.scaler.manager.ScalerManager`) through their storage seams: `WorkerJournal` is the hub's
journal (agent tokens minted here and kept only as SHA-256 in memory; agent messages become
`job.progress`, `log.chunk` and `event.emit` relays), `WorkerRecords` is the manager's spawn records
(its pending jobs are the held jobs no agent has taken), and `WorkerDispatcher` hands held jobs to
connected agents. Secrets and clone credentials live only in `HeldJob`, are masked in every relayed
line, and are erased when the job ends; terminal progress goes through the durable outbox first.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from conveyor.agents.journal import AgentJournal
from conveyor.agents.tokens import (
    AgentAuthRefusal,
    AgentTokenRow,
    display_prefix,
    generate_agent_token,
    looks_like_agent_token,
)
from conveyor.cluster.drain import NodeDrain
from conveyor.cluster.inventory import agent_inventory, scaler_inventory
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
from conveyor.execution.logs import masker_for
from conveyor.execution.queue import agent_can_take
from conveyor.model import protocol as p
from conveyor.model.ids import format_rfc3339, new_id, utc_now
from conveyor.scaler.backend import ScalerEntry
from conveyor.scaler.store import PendingJob

log = logging.getLogger(__name__)

LOG_BUFFER_BYTES = 8 * 1024 * 1024
TAKEN_BACK_REASONS = frozenset({"rerouted", "ack-timeout"})
RESEND_AFTER_S = 30.0
EMIT_TIMEOUT_S = 30.0
TERMINAL = frozenset({"success", "failed", "cancelled", "skipped", "timed_out"})


# --- agent tokens (memory only)


@dataclass
class _HeldToken:
    row: AgentTokenRow


class MemoryAgentTokens:
    """`cvy_agent_` tokens this worker mints for its own spawns; only their SHA-256 is kept."""

    def __init__(self, clock: Callable[[], datetime] = utc_now) -> None:
        self.clock = clock
        self._by_hash: dict[str, _HeldToken] = {}
        self._by_id: dict[str, _HeldToken] = {}

    def mint(
        self,
        *,
        labels: list[str],
        mandatory_labels: list[str],
        agent_id: str,
        expires_at: datetime,
        label: str,
    ) -> tuple[str, str]:
        """A new single-use ephemeral token bound to `agent_id`: `(token, token_id)`."""
        token = generate_agent_token()
        now = self.clock()
        row = AgentTokenRow(
            id=new_id(),
            org_id="default",
            label=label,
            kind="ephemeral",
            prefix=display_prefix(token),
            labels=list(labels),
            mandatory_labels=list(mandatory_labels),
            agent_id=agent_id,
            single_use=True,
            consumed_at=None,
            created_by=label[:64],
            created_at=now,
            expires_at=expires_at,
            revoked_at=None,
            last_used_at=None,
        )
        held = _HeldToken(row)
        self._by_hash[hashlib.sha256(token.encode()).hexdigest()] = held
        self._by_id[row.id] = held
        return token, row.id

    def authenticate(self, token: str) -> AgentTokenRow | AgentAuthRefusal:
        """Shape, hash lookup, revocation, expiry, single use (consumed here)."""
        if not looks_like_agent_token(token):
            return AgentAuthRefusal("unknown_token")
        held = self._by_hash.get(hashlib.sha256(token.encode()).hexdigest())
        if held is None:
            return AgentAuthRefusal("unknown_token")
        row, now = held.row, self.clock()
        if row.revoked_at is not None:
            return AgentAuthRefusal("revoked", row.id)
        if row.expires_at is not None and row.expires_at <= now:
            return AgentAuthRefusal("expired", row.id)
        if row.single_use and row.consumed_at is not None:
            return AgentAuthRefusal("consumed", row.id)
        held.row = _replace(row, consumed_at=now, last_used_at=now)
        return held.row

    def bind(self, token_id: str, agent_id: str) -> str | None:
        """An agent id belongs to the live token bound to it; a token serves one agent id."""
        now = self.clock()
        for other in self._by_id.values():
            row = other.row
            if (
                row.id != token_id
                and row.agent_id == agent_id
                and row.revoked_at is None
                and (row.expires_at is None or row.expires_at > now)
            ):
                return f"agent id {agent_id} is bound to another live token ({row.prefix}…)"
        held = self._by_id.get(token_id)
        if held is None or (held.row.agent_id is not None and held.row.agent_id != agent_id):
            return f"this token is bound to another agent id than {agent_id}"
        held.row = _replace(held.row, agent_id=agent_id)
        return None

    def revoke(self, token_id: str) -> None:
        """Forget a token (its agent's life ended)."""
        held = self._by_id.pop(token_id, None)
        if held is not None:
            self._by_hash = {h: t for h, t in self._by_hash.items() if t is not held}

    def __len__(self) -> int:
        return len(self._by_id)


def _replace(row: AgentTokenRow, **changes: Any) -> AgentTokenRow:
    return replace(row, **changes)


# --- relayed logs while disconnected


def _chunk_bytes(chunk: LogChunkRelay) -> int:
    return sum(len(str(line.get("text", ""))) for line in chunk.lines)


@dataclass
class LogRelayBuffer:
    """Chunks waiting for a coordinator: at most `limit` bytes per job; past it lines are dropped and the
    next chunk sent carries a `sys` line saying how many were lost."""

    limit: int = LOG_BUFFER_BYTES
    chunks: list[LogChunkRelay] = field(default_factory=list)
    size: int = 0
    dropped_lines: int = 0

    def add(self, chunk: LogChunkRelay) -> None:
        """Keep a chunk, or count its lines as dropped when the buffer is full."""
        size = _chunk_bytes(chunk)
        if self.size + size > self.limit:
            self.dropped_lines += len(chunk.lines)
            return
        self.chunks.append(chunk)
        self.size += size

    def drain(self) -> list[LogChunkRelay]:
        """Everything to send now, in order, the gap marker (if any) on the first chunk after the gap."""
        chunks, self.chunks, self.size = self.chunks, [], 0
        return chunks

    def gap_marker(self) -> dict[str, Any] | None:
        """The `sys` line recording dropped lines (once), or None."""
        if not self.dropped_lines:
            return None
        count, self.dropped_lines = self.dropped_lines, 0
        return {
            "stream": "sys",
            "text": f"[conveyor] {count} log line{'s' if count != 1 else ''} dropped: the worker's "
            f"{self.limit // (1024 * 1024)} MiB buffer filled while no coordinator was connected",
        }


@dataclass
class RelayedLogs:
    """Chunks sent to a coordinator, kept per job until the coordinator acknowledges the job's end.

    A chunk is not durable: one written to a coordinator that dies (or a link cut) before reading it is gone.
    The coordinator applies a worker's job messages in order and acknowledges the job's result after its
    commit, and the result is sent after the job's last chunk, so that acknowledgement proves every chunk
    applied — when it comes over the session the chunks went on. So each job remembers that session: before
    anything more of the job goes on another one (a reopened session, or another coordinator because the
    job's own went away), its kept chunks go there first; the coordinator drops those it stored already
    (their `seq`). At most `limit` bytes per job, oldest dropped.
    """

    limit: int = LOG_BUFFER_BYTES
    by_job: dict[str, tuple[str | None, list[LogChunkRelay], int]] = field(default_factory=dict)
    # The session each job's kept chunks were last sent on (compared by identity: a reconnection is new).
    sessions: dict[str, Any] = field(default_factory=dict)

    def sent(self, owner: str | None, chunk: LogChunkRelay, session: Any = None) -> None:
        """A chunk went out to the job's coordinator on `session`."""
        _, chunks, size = self.by_job.get(chunk.job_id, (owner, [], 0))
        chunks.append(chunk)
        size += _chunk_bytes(chunk)
        while size > self.limit and len(chunks) > 1:
            size -= _chunk_bytes(chunks.pop(0))
        self.by_job[chunk.job_id] = (owner, chunks, size)
        self.sessions[chunk.job_id] = session

    def behind(self, job_id: str, session: Any) -> list[LogChunkRelay]:
        """The job's kept chunks when they went on another session than `session` (else none)."""
        kept = self.by_job.get(job_id)
        if kept is None or self.sessions.get(job_id) is session:
            return []
        return list(kept[1])

    def caught_up(self, job_id: str, session: Any) -> None:
        """The job's kept chunks were sent again on `session`."""
        if job_id in self.by_job:
            self.sessions[job_id] = session

    def confirmed(self, job_id: str) -> None:
        """The job's end was acknowledged: its chunks are all applied."""
        self.by_job.pop(job_id, None)
        self.sessions.pop(job_id, None)

    def owners(self) -> list[tuple[str, str | None]]:
        """`(job, coordinator)` of every job with kept chunks."""
        return [(job_id, owner) for job_id, (owner, _, _) in self.by_job.items()]

    def keep_only(self, job_ids: set[str]) -> None:
        """Forget the jobs that are neither held nor awaiting their result's acknowledgement."""
        for job_id in set(self.by_job) - job_ids:
            del self.by_job[job_id]
            self.sessions.pop(job_id, None)


# --- held jobs


@dataclass
class HeldJob:
    """A job this worker accepted. Its secrets are here and nowhere else."""

    reroute: JobReroute
    owner: str
    state: str = "held"  # held → offered (sent to an agent) → acked → running → (gone)
    agent_id: str | None = None
    dispatch_id: str | None = None
    offered_at: float = 0.0
    bound_agent_id: str | None = None
    spawn_failures: int = 0
    not_before: float = 0.0
    final_steps: dict[int, dict[str, Any]] = field(default_factory=dict)
    logs: LogRelayBuffer = field(default_factory=LogRelayBuffer)
    accepted_at: datetime = field(default_factory=utc_now)

    @property
    def job_id(self) -> str:
        """The coordinator's job id."""
        return self.reroute.job_id

    @property
    def runs_on(self) -> dict[str, Any]:
        """The job's label rule."""
        return dict(self.reroute.labels.runs_on)

    def secret_values(self) -> tuple[str, ...]:
        """Every credential to mask in relayed lines."""
        checkout = self.reroute.checkout
        extra = [v for v in (checkout.clone_token, checkout.auth_header, self.reroute.job_token) if v]
        return tuple(sorted({*self.reroute.secrets.values(), *extra}, key=len, reverse=True))

    def erase(self) -> None:
        """Drop secrets and clone credentials (the job ended or left this worker)."""
        self.reroute.secrets.clear()
        self.reroute.checkout.clone_token = None
        self.reroute.checkout.auth_header = None
        self.reroute.job_token = None
        self.reroute.env.clear()

    def dispatch(self) -> p.JobDispatch:
        """The agent's `job.dispatch` for this job."""
        reroute = self.reroute
        return p.JobDispatch(
            id=new_id(),
            job_id=reroute.job_id,
            run_id=reroute.run_id,
            attempt=reroute.attempt,
            repo=p.RepoSpec(
                clone_url=reroute.checkout.repo_url,
                ref=reroute.checkout.ref,
                sha=reroute.checkout.sha,
                auth_header=reroute.checkout.auth_header,
            ),
            workflow=p.WorkflowSpec.model_validate(reroute.workflow),
            job=reroute.job,
            env=dict(reroute.env),
            secrets=dict(reroute.secrets),
            upstream=reroute.upstream,
            context=reroute.context,
            log_max_bytes=reroute.log_max_bytes,
            # The agent sends its transfers to this worker, which proxies them (docs/design/artifacts.md §4).
            artifacts=p.ArtifactAccess(token=reroute.job_token) if reroute.job_token else None,
        )


# --- the service


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
        """A `job.progress` for one of our jobs."""
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


# --- the agent hub's journal


class WorkerJournal(AgentJournal):
    """The worker's agent journal: tokens in memory, agent messages relayed to coordinators."""

    def __init__(self, service: WorkerService) -> None:
        self.service = service

    async def reset(self) -> None:
        """Nothing survives a worker restart but the outbox."""

    async def authenticate(self, token: str) -> AgentTokenRow | AgentAuthRefusal:
        """The in-memory token store."""
        return self.service.tokens.authenticate(token)

    async def bind(self, token_id: str, agent_id: str) -> str | None:
        """The in-memory token store."""
        return self.service.tokens.bind(token_id, agent_id)

    async def register(self, connection: Any, register: p.AgentRegister) -> list[str]:
        """Keep jobs the agent still runs for us; the others it reports are not ours."""
        not_owned: list[str] = []
        for item in register.in_flight:
            job = self.service.jobs.get(item.job_id)
            if job is not None and job.agent_id == connection.agent_id:
                connection.jobs.add(item.job_id)
            else:
                not_owned.append(item.job_id)
        return not_owned

    async def apply(self, connection: Any, message: Any) -> None:
        """One agent message."""
        service = self.service
        job = service.jobs.get(getattr(message, "job_id", "") or "")
        if job is not None and job.agent_id != connection.agent_id:
            job = None  # not this agent's to report
        if isinstance(message, p.Heartbeat):
            connection.draining = connection.draining or message.draining
            await connection.send(p.HeartbeatAck(ts=message.ts or time.time()))
        elif isinstance(message, p.JobAck):
            connection.pending_acks.pop(message.re, None)
            connection.answered.discard(message.job_id)
            if job is not None and job.state == "offered":
                job.state = "acked"
        elif isinstance(message, p.JobReject):
            connection.pending_acks.pop(message.re, None)
            connection.jobs.discard(message.job_id)
            connection.answered.discard(message.job_id)
            if message.reason == "draining":
                connection.draining = True
            elif message.reason == "busy":
                connection.busy_until = time.monotonic() + 1.0
            if job is not None:
                job.state, job.agent_id = "held", None
            service.dispatcher.wake()
        elif isinstance(message, p.JobStarted):
            if job is not None:
                job.state = "running"
                await service.relay(
                    job, service.progress(job, "job", "running", data={"agent_id": connection.agent_id})
                )
        elif isinstance(message, p.StepStarted):
            if job is not None:
                data = {"name": message.name, "kind": message.kind, "lock_index": message.lock_index}
                await service.relay(
                    job, service.progress(job, "step", "running", step_index=message.step_index, data=data)
                )
        elif isinstance(message, p.LogChunk):
            if job is not None:
                chunk = LogChunkRelay(
                    job_id=message.job_id,
                    step_index=message.step_index,
                    seq=message.seq,
                    lines=service.mask(job, message.lines),
                )
                await service.relay_log(job, chunk)
        elif isinstance(message, p.StepFinished):
            if job is not None:
                masker = masker_for(job.secret_values())
                step = {
                    "step_index": message.step_index,
                    "name": message.name,
                    "kind": message.kind,
                    "status": message.status,
                    "reason": message.reason,
                    "exit_code": message.exit_code,
                    "outputs": masker.mask_json(message.outputs),
                    "attempts": message.attempts,
                    "error": masker.mask(message.error) if message.error else None,
                    "duration_ms": message.duration_ms,
                }
                job.final_steps[message.step_index] = step
                await service.relay(
                    job,
                    service.progress(job, "step", message.status, step_index=message.step_index, data=step),
                )
            await connection.send(p.StatusAck(oseq=message.oseq))
        elif isinstance(message, p.JobFinished):
            if job is not None:
                progress = service.progress(
                    job,
                    "job",
                    message.status,
                    data={
                        "reason": message.reason,
                        "outputs": masker_for(job.secret_values()).mask_json(message.outputs),
                        "agent_id": connection.agent_id,
                    },
                    final_steps=[job.final_steps[i] for i in sorted(job.final_steps)],
                )
                await service.finish(job, progress)  # durable before the agent hears "done"
            await connection.send(p.StatusAck(oseq=message.oseq))
            connection.jobs.discard(message.job_id)
            connection.idle = time.monotonic()
            service.dispatcher.wake()
        elif isinstance(message, p.EventEmit):
            if job is None:
                result = p.EventEmitResult(
                    request_id=message.request_id,
                    error=p.EmitError(code="not_owned", detail="the job is not this agent's"),
                )
            else:
                result = await service.emit(job, message)
            await connection.send(result)
            await connection.send(p.StatusAck(oseq=message.oseq))

    async def disconnected(self, connection: Any, code: int) -> None:
        """Jobs of a lost agent: not started → held again; running → failed `agent_lost` (spawned agents
        are single use, so nothing reconnects to finish them)."""
        service = self.service
        for job in list(service.jobs.values()):
            if job.agent_id != connection.agent_id:
                continue
            if job.state in ("offered", "acked"):
                job.state, job.agent_id = "held", None
            else:
                progress = service.progress(
                    job,
                    "job",
                    "failed",
                    data={"reason": "agent_lost", "agent_id": connection.agent_id},
                    final_steps=[job.final_steps[i] for i in sorted(job.final_steps)],
                )
                await service.finish(job, progress)
        service.dispatcher.wake()

    async def sweep(self, connections: Mapping[str, Any]) -> None:
        """Offers not answered within the dispatch ack timeout: the agent is closed (4031), the job held again."""
        service = self.service
        now = service.clock()
        for job in list(service.jobs.values()):
            if job.state != "offered" or job.agent_id is None:
                continue
            if now - job.offered_at < service.dispatch_ack_timeout_ms / 1000:
                continue
            connection = connections.get(job.agent_id)
            if connection is not None and job.job_id in connection.answered:
                continue
            job.state, agent_id, job.agent_id = "held", job.agent_id, None
            if connection is not None:
                connection.jobs.discard(job.job_id)
                await connection.close(p.CLOSE_ACK_TIMEOUT, "dispatch ack timeout")
            log.warning("agent %s did not acknowledge job %s in time", agent_id, job.job_id)
        service.dispatcher.wake()


# --- the dispatcher


class WorkerDispatcher:
    """Hands held jobs to connected agents with a free matching slot (a spawned agent only its bound job)."""

    def __init__(self, service: WorkerService) -> None:
        self.service = service
        self.agents: dict[str, Any] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def wake(self) -> None:
        """Held jobs or capacity changed."""
        self._wake.set()

    async def start(self) -> None:
        """Begin dispatching."""
        self._task = asyncio.create_task(self._run(), name="worker-dispatcher")

    async def stop(self) -> None:
        """Stop dispatching."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    await self._wake.wait()
            self._wake.clear()
            try:
                await self.dispatch_round()
            except Exception:
                log.exception("worker dispatch round failed")

    async def dispatch_round(self) -> int:
        """Offer each held job to an agent that can take it; how many were offered."""
        sent = 0
        for job in sorted(self.service.jobs.values(), key=lambda j: j.accepted_at):
            if job.state != "held":
                continue
            link = self._taker(job)
            if link is None:
                continue
            dispatch = job.dispatch()
            job.state, job.agent_id, job.dispatch_id = "offered", link.agent_id, dispatch.id
            job.offered_at = self.service.clock()
            if await link.offer(dispatch):
                sent += 1
                log.info("job %s dispatched to agent %s", job.job_id, link.agent_id)
            else:
                job.state, job.agent_id = "held", None
        return sent

    def _taker(self, job: HeldJob) -> Any:
        links = sorted(self.agents.values(), key=lambda a: a.idle_since())
        bound = next((a for a in links if a.bound_job_id() == job.job_id and a.free_slot()), None)
        if bound is not None:
            return bound
        for link in links:
            slot = link.free_slot()
            if slot is None or link.bound_job_id() is not None:
                continue  # a spawned agent takes its bound job or none (docs/design/execution.md §5)
            if agent_can_take(job.runs_on, slot):
                return link
        return None


# --- the scaler's spawn records


class WorkerRecords:
    """The scaler manager's records on a worker: pending jobs are held jobs no agent has taken."""

    def __init__(self, service: WorkerService) -> None:
        self.service = service
        self.spawns: dict[str, str | None] = {}  # agent id → bound job id

    async def pending_jobs(self, limit: int) -> list[PendingJob]:
        """Held jobs waiting for an agent (not in a spawn-retry backoff), oldest first."""
        now = self.service.clock()
        waiting = [job for job in self.service.jobs.values() if job.state == "held" and job.not_before <= now]
        waiting.sort(key=lambda j: j.accepted_at)
        return [
            PendingJob(
                job_id=job.job_id,
                run_id=job.reroute.run_id,
                org_id=job.reroute.org_id,
                runs_on=job.runs_on,
                enqueued_at=job.accepted_at,
                bound_agent_id=job.bound_agent_id,
                note=None,
            )
            for job in waiting[:limit]
        ]

    async def spawn_exists(self, agent_id: str) -> bool:
        """Only this worker spawns for its jobs."""
        return agent_id in self.spawns

    async def set_wait_note(self, job_id: str, note: str) -> None:
        """Logged (the coordinator shows the reroute state)."""
        log.info("job %s %s", job_id, note)

    async def reserve(
        self,
        spawn: Any,
        job: PendingJob | None,
        *,
        entry: ScalerEntry,
        node_id: str,
        boot_id: str,
        token_expires_at: datetime,
        deadline_at: datetime,
    ) -> tuple[str, str] | None:
        """Bind the held job to the spawn and mint its single-use token (memory only)."""
        if job is not None:
            held = self.service.jobs.get(job.job_id)
            if held is None or held.bound_agent_id not in (None, job.bound_agent_id):
                return None
            held.bound_agent_id = spawn.agent_id
        self.spawns[spawn.agent_id] = job.job_id if job is not None else None
        return self.service.tokens.mint(
            labels=list(spawn.label_set.labels),
            mandatory_labels=list(entry.mandatory_labels),
            agent_id=spawn.agent_id,
            expires_at=token_expires_at,
            label=f"scaler:{entry.name}",
        )

    async def set_backend_ref(self, agent_id: str, ref: str) -> None:
        """Nothing to record."""

    async def spawn_failed(
        self, spawn: Any, *, outcome: str, message: str, log_tail: list[str], note: str
    ) -> None:
        """Relay the failure; retry within the job's spawn budget, then give the job back
        (docs/design/cluster.md §4.3)."""
        self._release(spawn)
        job = self.service.jobs.get(spawn.bound_job_id or "")
        if job is None or job.state != "held":
            return
        job.spawn_failures += 1
        budget = job.reroute.spawn_retry
        final = job.spawn_failures >= budget.max_attempts
        await self.service.relay(
            job,
            ScalerEventRelay(
                run_id=job.reroute.run_id,
                job_id=job.job_id,
                agent_id=spawn.agent_id,
                kind="failed",
                detail=message,
                attempt=job.spawn_failures,
                final=final,
                at=format_rfc3339(utc_now()),
            ),
        )
        if final:
            log.warning("job %s: spawn failed %d times; given back", job.job_id, job.spawn_failures)
            self.service._drop(job)
        else:
            job.not_before = self.service.clock() + budget.backoff_ms / 1000
            loop = asyncio.get_running_loop()
            loop.call_later(budget.backoff_ms / 1000 + 0.05, self.service.scaler_wake)

    async def spawn_ended(self, spawn: Any, *, outcome: str, error: str | None) -> None:
        """Token forgotten, binding released."""
        self._release(spawn)

    def _release(self, spawn: Any) -> None:
        if spawn.token_id:
            self.service.tokens.revoke(spawn.token_id)
        self.spawns.pop(spawn.agent_id, None)
        job = self.service.jobs.get(spawn.bound_job_id or "")
        if job is not None and job.bound_agent_id == spawn.agent_id:
            job.bound_agent_id = None

    async def registered(self, spawn: Any) -> bool:
        """Whether the spawn's bound job still waits for it."""
        job = self.service.jobs.get(spawn.bound_job_id or "")
        return job is not None and job.state == "held"

    async def reap(self, node_id: str, boot_id: str, live: set[str], claim_retention_ms: int) -> int:
        """Records of spawns no longer in memory are dropped."""
        lost = [agent_id for agent_id in self.spawns if agent_id not in live]
        for agent_id in lost:
            self.spawns.pop(agent_id, None)
        return len(lost)

    async def end_leftovers(self, node_id: str, boot_id: str) -> None:
        """Nothing recorded survives a restart."""


def worker_inventory(hub: Any, manager: Any) -> tuple[list[Any], list[Any]]:
    """This worker's heartbeat inventory: its agents and its scalers' capacity."""
    agents = agent_inventory(hub.connections.values()) if hub is not None else []
    scalers = scaler_inventory(manager.status()) if manager is not None else []
    return agents, scalers


def worker_knob_default(settings: Any) -> Callable[[str, str | None], Awaitable[int]]:
    """A knob's value from the worker's own configuration (env/YAML default, else built in)."""
    from conveyor.model.knobs import CLUSTER_KNOBS_BY_NAME, ORG_KNOBS_BY_NAME

    async def knob(name: str, org_id: str | None) -> int:
        definition = ORG_KNOBS_BY_NAME.get(name) or CLUSTER_KNOBS_BY_NAME[name]
        value = settings.knob_default(definition)
        return int(value if value is not None else definition.default or 0)

    return knob


def worker_knob(settings: Any, snapshot: Any) -> Callable[[str, str | None], Awaitable[int]]:
    """The one accessor for the knobs a worker applies (e.g. `agent_token_ttl_ms`).

    A knob of the cluster-settings snapshot (docs/design/cluster.md §5.3: the "agents, scaler" group) is read
    from the applied snapshot at each call, so a pulled version applies at the next spawn; any other knob (and
    one a coordinator's snapshot left out) comes from the worker's own configuration.
    """
    fallback = worker_knob_default(settings)

    async def knob(name: str, org_id: str | None) -> int:
        applied = snapshot.current()
        if name in applied.settings:
            return int(applied.value(name))
        return await fallback(name, org_id)

    return knob


__all__ = [
    "HeldJob",
    "LogRelayBuffer",
    "MemoryAgentTokens",
    "WorkerDispatcher",
    "WorkerJournal",
    "WorkerRecords",
    "WorkerService",
]
