"""Where an agent hub records what its agents do (docs/design/execution.md §6): the seam between the socket
and storage.

`AgentHub` runs the socket (handshake, ordered frames, dead agents) and hands every durable fact to
its journal. A coordinator's journal is `DatabaseJournal` (the shared rows, guarded writes, acks after
commit); a worker's is in memory and relays to its coordinators (`conveyor.cluster.worker`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.agents import store as agent_store
from conveyor.agents.reported_time import reported_time
from conveyor.agents.tokens import AgentAuthRefusal, AgentTokenRow
from conveyor.db.dialect import dialect_insert
from conveyor.db.engine import Database
from conveyor.db.tables import agents, dispatch_queue, jobs
from conveyor.execution.lifecycle import Effects, finish_job, record_step, start_job
from conveyor.execution.log_store import attempt_or_current
from conveyor.execution.logs import DispatchAttempt, masker_for, named_attempt
from conveyor.execution.queue import requeue
from conveyor.execution.transitions import transition
from conveyor.model import protocol as p
from conveyor.model.ids import utc_now

if TYPE_CHECKING:
    from conveyor.agents.hub import AgentConnection, AgentDispatcher, HubSettings

log = logging.getLogger(__name__)

LAST_SEEN_WRITE_S = 15.0

# Stores a chunk in the log of the dispatch attempt given (None: the chunk named none, docs/design/execution.md §9).
LogAppender = Callable[[AsyncConnection, p.LogChunk, list[str], DispatchAttempt | None], Awaitable[Any]]
EventEmitter = Callable[[str, p.EventEmit], Awaitable[p.EventEmitResult]]
# The secret values of a job, read again from the secret store (job id -> values).
SecretValues = Callable[[AsyncConnection, str], Awaitable[list[str]]]


class AgentJournal(Protocol):
    """What an agent hub asks of its storage."""

    async def reset(self) -> None:
        """At start: agents a previous process of this node left connected are connected nowhere now."""
        ...

    async def authenticate(self, token: str) -> AgentTokenRow | AgentAuthRefusal:
        """Check a presented agent token (consuming a single-use one)."""
        ...

    async def bind(self, token_id: str, agent_id: str) -> str | None:
        """Bind the token to the agent id at first registration; the refusal reason, if any."""
        ...

    async def register(self, connection: AgentConnection, register: p.AgentRegister) -> list[str]:
        """Record the registration, reconcile held jobs; the `in_flight` jobs the agent does not own."""
        ...

    async def apply(self, connection: AgentConnection, message: Any) -> None:
        """Apply one message from the connection holding the agent's registration (and answer it)."""
        ...

    async def disconnected(self, connection: AgentConnection, code: int) -> None:
        """The registration's connection ended: what happens to its jobs."""
        ...

    async def sweep(self, connections: Mapping[str, AgentConnection]) -> None:
        """Periodic: passed ack deadlines and cancels for jobs of these connections."""
        ...


class DatabaseJournal:
    """A coordinator's journal: the shared `agents`, `jobs`, `steps` and `dispatch_queue` rows."""

    def __init__(
        self,
        db: Database,
        dispatcher: AgentDispatcher,
        *,
        owner: Callable[[], str],
        settings: HubSettings,
        append_log: LogAppender | None,
        on_effects: Callable[[Effects], Awaitable[None]],
        on_job_changed: Callable[[str], None],
        event_emitter: Callable[[], EventEmitter | None],
        secret_values: SecretValues | None = None,
    ) -> None:
        self.db = db
        self.dispatcher = dispatcher
        self.owner = owner
        self.settings = settings
        self.append_log = append_log
        self.on_effects = on_effects
        self.on_job_changed = on_job_changed
        self.event_emitter = event_emitter
        self.secret_values = secret_values
        # When the sweep last re-checked the tokens behind live connections (monotonic).
        self._tokens_checked = 0.0
        # The handler of each message type `apply` takes (others are not the journal's: ignored).
        self._handlers: dict[type[Any], Callable[[AgentConnection, Any], Awaitable[None]]] = {
            p.Heartbeat: self._heartbeat,
            p.JobAck: self._acked,
            p.JobReject: self._rejected,
            p.JobStarted: self._job_started,
            p.StepStarted: self._step_started,
            p.LogChunk: self._log_chunk,
            p.StepFinished: self._step_finished,
            p.JobFinished: self._job_finished,
            p.EventEmit: self._event_emit,
        }

    async def _secrets(
        self, conn: AsyncConnection, connection: AgentConnection, job_id: str, *, remember: bool = True
    ) -> list[str]:
        """The values to mask in what the agent reports about a job: those dispatched on this connection,
        else (the agent registered again since, or this process restarted) the job's values read again,
        kept for its next reports when `remember` (the job is the agent's)."""
        known = connection.secrets.get(job_id)
        if known is None and self.secret_values is not None:
            known = await self.secret_values(conn, job_id)
            if remember:
                connection.secrets[job_id] = known
        return known or []

    async def reset(self) -> None:
        """Agent rows this instance left online go offline, so the leader may recover their jobs."""
        async with self.db.transaction() as conn:
            await conn.execute(
                update(agents)
                .where(agents.c.instance_id == self.owner(), agents.c.state != "offline")
                .values(state="offline", disconnected_at=utc_now())
            )

    async def authenticate(self, token: str) -> AgentTokenRow | AgentAuthRefusal:
        """`agent_tokens` lookup (committed, so a single-use consumption sticks)."""
        async with self.db.transaction() as conn:
            return await agent_store.authenticate_agent_token(conn, token, utc_now())

    async def bind(self, token_id: str, agent_id: str) -> str | None:
        """`agent_tokens.agent_id`: an agent id belongs to its live token."""
        async with self.db.transaction() as conn:
            bind = await agent_store.bind_agent_id(conn, token_id, agent_id, utc_now())
        return bind.reason if bind is not None else None

    async def register(self, connection: AgentConnection, register: p.AgentRegister) -> list[str]:
        """Upsert the agent row and reconcile the jobs we hold for it (docs/design/execution.md §6).

        Returns the `in_flight` jobs the agent does not own, to be cancelled after `register.ack`.
        """
        now = utc_now()
        in_flight = {item.job_id for item in register.in_flight}
        unacked = set(register.unacked_jobs)
        effects: list[Effects] = []
        not_owned: list[str] = []
        async with self.db.transaction() as conn:
            values = {
                "org_id": "default",
                "token_id": connection.token_id,
                "labels": list(connection.labels),
                "mandatory_labels": list(connection.mandatory_labels),
                "capacity": connection.capacity,
                "version": register.version,
                "hostname": register.host.hostname,
                "os": register.host.os,
                "arch": register.host.arch,
                "ephemeral": connection.ephemeral,
                "instance_id": self.owner(),
                "state": "online",
                "connected_at": now,
                "last_seen_at": now,
            }
            statement = dialect_insert(conn, agents).values(
                agent_id=connection.agent_id, first_seen_at=now, **values
            )
            await conn.execute(statement.on_conflict_do_update(index_elements=["agent_id"], set_=values))
            held = await conn.execute(
                select(jobs.c.id, jobs.c.status).where(
                    jobs.c.agent_id == connection.agent_id,
                    jobs.c.status.in_(["dispatched", "running", "recovering", "cancelling"]),
                )
            )
            for job_id, status in list(held):
                if job_id in in_flight:
                    connection.jobs.add(job_id)
                    if status == "recovering":
                        await transition(
                            conn, "job", job_id, "running", recovery_deadline=None, last_heartbeat_at=now
                        )
                elif job_id in unacked:
                    connection.jobs.add(job_id)
                elif status == "dispatched":
                    result = await requeue(
                        conn,
                        job_id,
                        outcome="agent_lost",
                        detail="agent re-registered without it",
                        now=now,
                        max_attempts=self.settings.max_attempts,
                        agent_id=connection.agent_id,
                    )
                    if result:
                        effects.append(result)
                else:
                    effects.append(
                        await finish_job(
                            conn, job_id, "failed", reason="agent_lost", queue_outcome="agent_lost"
                        )
                    )
            held_ids = {row for row in connection.jobs}
            for job_id in in_flight - held_ids:
                not_owned.append(job_id)
        for result in effects:
            await self.on_effects(result)
        return not_owned

    async def apply(self, connection: AgentConnection, message: Any) -> None:
        """Apply one message; durable ones are acknowledged after commit."""
        handler = self._handlers.get(type(message))
        if handler is not None:
            await handler(connection, message)

    async def _acked(self, connection: AgentConnection, message: p.JobAck) -> None:
        connection.pending_acks.pop(message.re, None)
        async with self.db.transaction() as conn:
            await conn.execute(
                update(dispatch_queue)
                .where(
                    dispatch_queue.c.job_id == message.job_id,
                    dispatch_queue.c.agent_id == connection.agent_id,
                    dispatch_queue.c.state == "claimed",
                )
                .values(ack_deadline=None)
            )
        connection.answered.discard(message.job_id)

    async def _job_started(self, connection: AgentConnection, message: p.JobStarted) -> None:
        async with self.db.transaction() as conn:
            if await self._owns(conn, connection, message.job_id):
                await start_job(
                    conn, message.job_id, connection.agent_id, reported_time(message.ts, utc_now())
                )

    async def _step_started(self, connection: AgentConnection, message: p.StepStarted) -> None:
        async with self.db.transaction() as conn:
            if await self._owns(conn, connection, message.job_id):
                await record_step(
                    conn,
                    message.job_id,
                    message.step_index,
                    name=message.name,
                    kind=message.kind,
                    lock_index=message.lock_index,
                    status="running",
                    started_at=reported_time(message.ts, utc_now()),
                )

    async def _log_chunk(self, connection: AgentConnection, message: p.LogChunk) -> None:
        if self.append_log is None:
            return
        async with self.db.transaction() as conn:
            if await self._owns(conn, connection, message.job_id, terminal_ok=True):
                secrets = await self._secrets(conn, connection, message.job_id)
                # A coordinator's own agent: its executions come through no worker (hop 0).
                await self.append_log(conn, message, secrets, named_attempt(message.attempt))
        self.on_job_changed(message.job_id)

    async def _step_finished(self, connection: AgentConnection, message: p.StepFinished) -> None:
        async with self.db.transaction() as conn:
            if await self._owns(conn, connection, message.job_id, terminal_ok=False):
                # The agent masked them already; mask again before anything is stored.
                masker = masker_for(tuple(await self._secrets(conn, connection, message.job_id)))
                await record_step(
                    conn,
                    message.job_id,
                    message.step_index,
                    name=message.name or f"step {message.step_index}",
                    kind=message.kind or "step",
                    status=message.status,
                    reason=message.reason,
                    exit_code=message.exit_code,
                    outputs=masker.mask_json(message.outputs),
                    attempts=message.attempts,
                    error=masker.mask(message.error) if message.error else message.error,
                    duration_ms=message.duration_ms,
                    finished_at=utc_now(),
                )
        await connection.send(p.StatusAck(oseq=message.oseq))
        self.on_job_changed(message.job_id)

    async def _job_finished(self, connection: AgentConnection, message: p.JobFinished) -> None:
        effects = None
        async with self.db.transaction() as conn:
            if await self._owns(conn, connection, message.job_id):
                masker = masker_for(tuple(await self._secrets(conn, connection, message.job_id)))
                effects = await finish_job(
                    conn,
                    message.job_id,
                    message.status,
                    reason=message.reason,
                    outputs=masker.mask_json(message.outputs),
                    counted_attempt=await attempt_or_current(
                        conn, message.job_id, named_attempt(message.attempt)
                    ),
                )
        await connection.send(p.StatusAck(oseq=message.oseq))
        connection.jobs.discard(message.job_id)
        connection.secrets.pop(message.job_id, None)
        connection.idle = time.monotonic()
        self.on_job_changed(message.job_id)
        if effects is not None:
            await self.on_effects(effects)
        self.dispatcher.wake()

    async def _event_emit(self, connection: AgentConnection, message: p.EventEmit) -> None:
        # The event router's producer (plugged in by the server) inserts it and answers after commit.
        if (emitter := self.event_emitter()) is None:
            result = p.EventEmitResult(
                request_id=message.request_id,
                error=p.EmitError(code="events_disabled", detail="events are not enabled on this node"),
            )
        else:
            values = connection.secrets.get(message.job_id)
            if values is None:
                # Not known to be this agent's job yet: the emitter checks; nothing is remembered.
                async with self.db.read() as conn:
                    values = await self._secrets(conn, connection, message.job_id, remember=False)
            payload = masker_for(tuple(values)).mask_json(message.payload)
            result = await emitter(connection.agent_id, message.model_copy(update={"payload": payload}))
        await connection.send(result)
        await connection.send(p.StatusAck(oseq=message.oseq))

    async def _owns(
        self, conn: AsyncConnection, connection: AgentConnection, job_id: str, *, terminal_ok: bool = False
    ) -> bool:
        row = (
            await conn.execute(
                select(jobs.c.agent_id, jobs.c.status, agents.c.token_id, agents.c.instance_id)
                .select_from(jobs.outerjoin(agents, agents.c.agent_id == jobs.c.agent_id))
                .where(jobs.c.id == job_id)
            )
        ).first()
        if row is None or row.agent_id != connection.agent_id:
            log.warning(
                "refused a message about job %s from agent %s: the job was not dispatched to it",
                job_id,
                connection.agent_id,
            )
            return False
        if row.token_id != connection.token_id or row.instance_id != self.owner():
            # The agent registered again since (here under another token after a re-key, or on
            # another coordinator): that registration reports for the job, not this connection.
            log.warning(
                "refused a message about job %s from a stale connection of agent %s",
                job_id,
                connection.agent_id,
            )
            return False
        if not terminal_ok and row.status in ("success", "failed", "cancelled", "skipped", "timed_out"):
            return False  # a replay of something already applied: acknowledged, not applied twice
        return True

    async def _heartbeat(self, connection: AgentConnection, message: p.Heartbeat) -> None:
        now_mono = time.monotonic()
        connection.draining = connection.draining or message.draining
        if now_mono - connection.last_seen_written >= LAST_SEEN_WRITE_S or message.running:
            connection.last_seen_written = now_mono
            now = utc_now()
            async with self.db.transaction() as conn:
                await conn.execute(
                    update(agents).where(agents.c.agent_id == connection.agent_id).values(last_seen_at=now)
                )
                if message.running:
                    await conn.execute(
                        update(jobs)
                        .where(jobs.c.id.in_(message.running), jobs.c.agent_id == connection.agent_id)
                        .values(last_heartbeat_at=now)
                    )
        await connection.send(p.HeartbeatAck(ts=message.ts or time.time()))

    async def _rejected(self, connection: AgentConnection, message: p.JobReject) -> None:
        connection.pending_acks.pop(message.re, None)
        connection.jobs.discard(message.job_id)
        if message.reason == "draining":
            connection.draining = True
        elif message.reason == "busy":
            connection.busy_until = time.monotonic() + 1.0
        async with self.db.transaction() as conn:
            effects = await requeue(
                conn,
                message.job_id,
                outcome="rejected",
                detail=f"{message.reason}: {message.detail}",
                now=utc_now(),
                delay_ms=1000,
                max_attempts=self.settings.max_attempts,
                agent_id=connection.agent_id,
            )
        connection.answered.discard(message.job_id)
        if effects:
            await self.on_effects(effects)
        self.dispatcher.wake()

    async def disconnected(self, connection: AgentConnection, code: int) -> None:
        """One transaction: agent offline; dispatched jobs requeued; running ones recovering
        (docs/design/execution.md §6)."""
        now = utc_now()
        results: list[Effects] = []
        async with self.db.transaction() as conn:
            await conn.execute(
                update(agents)
                .where(agents.c.agent_id == connection.agent_id)
                .values(state="offline", disconnected_at=now, last_close_code=code)
            )
            held = list(
                await conn.execute(
                    select(jobs.c.id, jobs.c.status).where(
                        jobs.c.agent_id == connection.agent_id,
                        jobs.c.status.in_(["dispatched", "running", "cancelling"]),
                    )
                )
            )
            for job_id, status in held:
                if status == "dispatched":
                    result = await requeue(
                        conn,
                        job_id,
                        outcome="agent_lost",
                        detail=f"agent disconnected ({code})",
                        now=now,
                        max_attempts=self.settings.max_attempts,
                        agent_id=connection.agent_id,
                    )
                    if result:
                        results.append(result)
                elif status == "cancelling":
                    results.append(
                        await finish_job(
                            conn, job_id, "cancelled", reason="cancelled_by", queue_outcome="cancelled"
                        )
                    )
                elif connection.ephemeral:
                    results.append(
                        await finish_job(
                            conn, job_id, "failed", reason="agent_lost", queue_outcome="agent_lost"
                        )
                    )
                else:
                    deadline = now + timedelta(milliseconds=self.settings.recovery_grace_ms)
                    await transition(conn, "job", job_id, "recovering", recovery_deadline=deadline)
        for result in results:
            await self.on_effects(result)
        self.dispatcher.wake()

    async def sweep(self, connections: Mapping[str, AgentConnection]) -> None:
        """Passed ack deadlines (4031), cancels for jobs our agents run, and revoked tokens (4010).

        A revocation closes its agents at once through the kicker (`agent_token.revoke`); a node that
        missed that notice (it was unreachable or restarting) still closes them here, once per
        agent heartbeat interval.
        """
        now = utc_now()
        now_mono = time.monotonic()
        revoked: set[str] = set()
        async with self.db.read() as conn:
            if now_mono - self._tokens_checked >= self.settings.heartbeat_ms / 1000:
                self._tokens_checked = now_mono
                revoked = await agent_store.revoked_among(
                    conn, sorted({c.token_id for c in connections.values()})
                )
            late = list(
                await conn.execute(
                    select(
                        dispatch_queue.c.job_id, dispatch_queue.c.agent_id, dispatch_queue.c.attempts
                    ).where(
                        dispatch_queue.c.state == "claimed",
                        dispatch_queue.c.ack_deadline.is_not(None),
                        dispatch_queue.c.ack_deadline < now,
                        dispatch_queue.c.agent_id.in_(list(connections)),
                    )
                )
            )
            cancelling = list(
                await conn.execute(
                    select(jobs.c.id, jobs.c.agent_id, jobs.c.reason).where(
                        jobs.c.status == "cancelling", jobs.c.agent_id.in_(list(connections))
                    )
                )
            )
        for connection in list(connections.values()):
            if connection.token_id in revoked:
                log.info(
                    "closing agent %s: its token %s is revoked", connection.agent_id, connection.token_id
                )
                await connection.close(p.CLOSE_AUTH_FAILED, "agent token revoked")
        for job_id, agent_id, attempt in late:
            late_agent = connections.get(agent_id)
            if late_agent is not None and job_id in late_agent.answered:
                continue  # its answer arrived and waits behind an earlier frame: not late
            async with self.db.transaction() as conn:
                effects = await requeue(
                    conn,
                    job_id,
                    outcome="ack_timeout",
                    detail="no job.ack before the deadline",
                    now=now,
                    max_attempts=self.settings.max_attempts,
                    agent_id=agent_id,
                    attempt=attempt,
                    ack_due_before=now,
                )
            if effects is None:
                continue  # acked (or handed back) since the read: not late after all
            if late_agent is not None:
                late_agent.jobs.discard(job_id)
                await late_agent.close(p.CLOSE_ACK_TIMEOUT, "dispatch ack timeout")
            if effects:
                await self.on_effects(effects)
        for job_id, agent_id, reason in cancelling:
            holder = connections.get(agent_id)
            force = "(force)" in (reason or "")
            key = f"{job_id}:{force}"
            if holder is not None and key not in holder.cancels_sent:
                holder.cancels_sent.add(key)
                await holder.send(p.JobCancel(job_id=job_id, reason=reason or "cancelled", force=force))
