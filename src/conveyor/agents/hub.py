"""The orchestrator side of the agent protocol (docs/design/execution.md §6): handshake, registry, messages,
recovery.

One `AgentHub` per coordinator holds the agents connected to it. Durable agent messages are
applied with guarded writes and acknowledged only after commit; a status for a job that is
terminal, unknown or owned by another agent is acknowledged and dropped, so outbox replays are
harmless.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import ValidationError
from starlette.websockets import WebSocket, WebSocketDisconnect

from conveyor.agents.journal import AgentJournal, DatabaseJournal, LogAppender, SecretValues
from conveyor.agents.tokens import AgentAuthRefusal, check_registration_labels, normalise_labels
from conveyor.db.engine import Database, retry_transient
from conveyor.execution.lifecycle import Effects
from conveyor.execution.queue import AgentSlot, ClaimScope, single_use_scope
from conveyor.model import protocol as p
from conveyor.model.ids import new_id
from conveyor.parts import PartKey
from conveyor.runtime.loops import WakeableLoop
from conveyor.version import VERSION

log = logging.getLogger(__name__)

AUTH_TIMEOUT_S = 5.0
REGISTER_TIMEOUT_S = 10.0

MESSAGE_ATTEMPTS = 5
# Frames read ahead of the one being applied (then the reader waits: the socket's backpressure).
INBOX_FRAMES = 256


class ScalerLink(Protocol):
    """The scaler's side of registration (docs/design/scaler.md §3), wired in by the server at start-up."""

    async def agent_registered(self, agent_id: str) -> str | None:
        """A spawned agent registered: its bound job when that job still waits (`pending_dispatch`)."""
        ...

    def bound_job(self, agent_id: str) -> str | None:
        """The job a spawned agent was started for, waiting or not: the only one it may be sent."""
        ...

    def agent_disconnected(self, agent_id: str) -> None:
        """Any disconnect of a spawned agent ends its compute (single use)."""
        ...


@dataclass(frozen=True)
class _Closed:
    """The socket closed (or failed) with this code; frames read before it are applied first."""

    code: int


@dataclass(frozen=True)
class _Malformed:
    """A frame that is no agent message: the connection is closed 4000 once the ones before it are applied."""

    detail: str


@dataclass
class HubSettings:
    """Timings (all configurable so tests run fast)."""

    heartbeat_ms: int
    dead_after_ms: int
    recovery_grace_ms: int
    max_attempts: int


@dataclass
class AgentConnection:
    """One connected agent: what the orchestrator counts, not what the agent claims."""

    websocket: WebSocket
    agent_id: str
    token_id: str
    labels: tuple[str, ...]
    mandatory_labels: tuple[str, ...]
    capacity: int
    ephemeral: bool
    jobs: set[str] = field(default_factory=set)
    pending_acks: dict[str, str] = field(default_factory=dict)
    # Jobs whose job.ack / job.reject has arrived but may still wait behind earlier frames to be
    # applied: not late, whatever the ack deadline in the row says.
    answered: set[str] = field(default_factory=set)
    secrets: dict[str, list[str]] = field(default_factory=dict)
    cancels_sent: set[str] = field(default_factory=set)
    draining: bool = False
    busy_until: float = 0.0
    idle: float = field(default_factory=time.monotonic)
    last_frame: float = field(default_factory=time.monotonic)
    last_seen_written: float = 0.0
    closed: bool = False
    # The job a scaler started this agent for (whether or not it still waited at registration).
    bound: str | None = None
    # A single-use connection was sent its one `job.dispatch` (or held a job when it registered).
    dispatched: bool = False
    send_lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def single_use(self) -> bool:
        """Ephemeral, or started by a scaler for one job (docs/design/execution.md §5, "Single use")."""
        return self.ephemeral or self.bound is not None

    def claim_scope(self) -> ClaimScope:
        return single_use_scope(
            single_use=self.single_use, bound_job_id=self.bound, dispatched=self.dispatched
        )

    def free_slot(self) -> AgentSlot | None:
        if (
            self.closed
            or self.draining
            or len(self.jobs) >= self.capacity
            or time.monotonic() < self.busy_until
            or self.claim_scope().closed
        ):
            return None
        return AgentSlot(self.agent_id, self.labels, self.mandatory_labels)

    def idle_since(self) -> float:
        return self.idle

    def bound_job_id(self) -> str | None:
        """The only job this agent may be sent (its spawn's); None: any its labels match."""
        return self.claim_scope().job_id

    async def send(self, message: p.Message) -> bool:
        if self.closed:
            return False
        try:
            async with self.send_lock:
                await self.websocket.send_text(message.model_dump_json())
        except Exception:
            return False
        return True

    async def offer(self, dispatch: p.JobDispatch) -> bool:
        if self.single_use:
            # Set before the send: whether or not it arrives, this connection is sent no other job.
            self.dispatched = True
        self.jobs.add(dispatch.job_id)
        self.pending_acks[dispatch.id] = dispatch.job_id
        self.secrets[dispatch.job_id] = list(dispatch.secrets.values())
        if await self.send(dispatch):
            return True
        self.jobs.discard(dispatch.job_id)
        self.pending_acks.pop(dispatch.id, None)
        return False

    async def close(self, code: int, reason: str = "") -> None:
        if not self.closed:
            self.closed = True
            with contextlib.suppress(Exception):
                await self.websocket.close(code=code, reason=reason[:120])


class AgentDispatcher(Protocol):
    """What the hub needs of a dispatcher: the connected agents it serves, and a wake-up."""

    @property
    def agents(self) -> dict[str, Any]:
        """Connected agents by id (the hub adds and removes them)."""
        ...

    def wake(self) -> None:
        """Capacity changed."""
        ...


class AgentHub:
    """Agents connected to this node (a coordinator, or a worker with an in-memory journal)."""

    def __init__(
        self,
        db: Database | None,
        dispatcher: AgentDispatcher,
        *,
        owner: Callable[[], str],
        settings: HubSettings,
        append_log: LogAppender | None,
        on_effects: Callable[[Effects], Awaitable[None]],
        on_job_changed: Callable[[str], None] | None = None,
        journal: AgentJournal | None = None,
        secret_values: SecretValues | None = None,
    ) -> None:
        self.db = db
        self.dispatcher = dispatcher
        self.owner = owner
        self.settings = settings
        self.append_log = append_log
        self.on_effects = on_effects
        # A job's secret values read again (masking what its agent reports after a reconnect); reroutes use it too.
        self.secret_values = secret_values
        # Wakes live log readers once a chunk or a status change committed.
        self.on_job_changed = on_job_changed or (lambda _job_id: None)
        self.connections: dict[str, AgentConnection] = {}
        # Weak: an agent id's lock lives only while a registration or disconnect holds or awaits it.
        self._handover_locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        self._sweep = WakeableLoop(
            "agent-hub-sweep", self.sweep_once, max(0.05, min(settings.heartbeat_ms, 1000) / 1000), log
        )
        self.scaler_link: ScalerLink | None = None
        # `ctx.emit`: (agent id, message) -> the answer; set by the events start-up hook.
        self.event_emitter: Callable[[str, p.EventEmit], Awaitable[p.EventEmitResult]] | None = None
        if journal is None:
            assert db is not None, "an agent hub without a journal records in the database"
            journal = DatabaseJournal(
                db,
                dispatcher,
                owner=owner,
                settings=settings,
                append_log=append_log,
                on_effects=on_effects,
                on_job_changed=self.on_job_changed,
                event_emitter=lambda: self.event_emitter,
                secret_values=secret_values,
            )
        self.journal = journal

    # --- lifecycle

    async def start(self) -> None:
        """Begin the local sweep (dead agents, ack deadlines, cancels for our agents).

        Agent rows a previous process of this instance left online are connected nowhere now: they
        go offline, so the leader's heartbeat check may recover their jobs
        (docs/design/execution.md §6, §8.4).
        """
        await self.journal.reset()
        await self._sweep.start()

    async def stop(self) -> None:
        """Close every connection (1001) and stop."""
        await self._sweep.stop()
        for connection in list(self.connections.values()):
            await connection.close(p.CLOSE_GOING_AWAY, "orchestrator going away")

    # --- the socket

    async def serve(self, websocket: WebSocket) -> None:
        """Run one agent connection from handshake to close."""
        await websocket.accept()
        connection: AgentConnection | None = None
        code = p.CLOSE_NORMAL
        try:
            connection = await self._handshake(websocket)
            if connection is None:
                return
            code = await self._run(connection)
        except WebSocketDisconnect as exc:
            code = exc.code
        except Exception:
            log.exception("agent connection failed")
            code = p.CLOSE_INTERNAL
        finally:
            if connection is not None:
                await self._disconnected(connection, code)

    async def _run(self, connection: AgentConnection) -> int:
        """Apply the agent's frames one at a time, in order, as a reader takes them off the socket.

        The reader notes each frame's arrival (dead-after) and each answered dispatch (ack
        deadline) at once, so a frame waiting behind a slow one (a transaction queued for a row
        lock or a pool connection on a busy node) is never taken for the agent's silence.
        Returns the close code.
        """
        inbox: asyncio.Queue[Any] = asyncio.Queue(maxsize=INBOX_FRAMES)
        reader = asyncio.create_task(
            self._read(connection, inbox), name=f"agent-reader-{connection.agent_id}"
        )
        try:
            while True:
                item = await inbox.get()
                if isinstance(item, _Closed):
                    return item.code
                if isinstance(item, _Malformed):
                    await connection.close(p.CLOSE_BAD_MESSAGE, item.detail)
                    return p.CLOSE_BAD_MESSAGE
                await self._apply(connection, item)
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)

    async def _read(self, connection: AgentConnection, inbox: asyncio.Queue[Any]) -> None:
        """Take frames off the socket until it closes or a frame is malformed (then stop reading)."""
        try:
            while True:
                raw = await connection.websocket.receive_text()
                connection.last_frame = time.monotonic()
                try:
                    message = p.parse_agent_message(raw)
                except ValidationError as exc:
                    problem = exc.errors()[0]
                    where = ".".join(str(x) for x in problem.get("loc", ()))
                    await inbox.put(_Malformed(f"bad message: {where}: {problem.get('msg')}"))
                    return
                if isinstance(message, p.JobAck | p.JobReject):
                    connection.answered.add(message.job_id)
                await inbox.put(message)
        except WebSocketDisconnect as exc:
            await inbox.put(_Closed(exc.code))
        except Exception:
            log.exception("reading from agent %s failed", connection.agent_id)
            await inbox.put(_Closed(p.CLOSE_INTERNAL))

    async def _handshake(self, websocket: WebSocket) -> AgentConnection | None:
        try:
            raw = await asyncio.wait_for(websocket.receive_text(), AUTH_TIMEOUT_S)
            auth = p.AuthRequest.model_validate_json(raw)
        except TimeoutError:
            await websocket.close(p.CLOSE_HANDSHAKE_TIMEOUT, "no auth.request")
            return None
        except ValidationError:
            await websocket.close(p.CLOSE_BAD_MESSAGE, "expected auth.request")
            return None
        if auth.protocol != p.PROTOCOL_VERSION:
            await websocket.send_text(p.AuthFailure(reason="protocol_unsupported").model_dump_json())
            await websocket.close(p.CLOSE_PROTOCOL_UNSUPPORTED, "protocol version unsupported")
            return None
        token = await self.journal.authenticate(auth.token)
        if isinstance(token, AgentAuthRefusal):
            await self._refuse(websocket, token.reason)
            return None
        await websocket.send_text(
            p.AuthSuccess(
                connection_id=new_id(),
                instance_id=self.owner(),
                server_version=VERSION,
                heartbeat_ms=self.settings.heartbeat_ms,
            ).model_dump_json()
        )
        try:
            register = p.AgentRegister.model_validate_json(
                await asyncio.wait_for(websocket.receive_text(), REGISTER_TIMEOUT_S)
            )
        except TimeoutError:
            await websocket.close(p.CLOSE_HANDSHAKE_TIMEOUT, "no agent.register")
            return None
        except ValidationError:
            await websocket.close(p.CLOSE_BAD_MESSAGE, "expected agent.register")
            return None
        labels = normalise_labels(register.labels)
        refusal = check_registration_labels(token, labels)
        if refusal is None:
            refusal = await self.journal.bind(token.id, register.agent_id)
            if refusal is not None:
                log.warning(
                    "refused registration of agent id %s with token %s: %s",
                    register.agent_id,
                    token.id,
                    refusal,
                )
        if refusal is not None:
            await self._refuse(websocket, refusal)
            return None
        connection = AgentConnection(
            websocket=websocket,
            agent_id=register.agent_id,
            token_id=token.id,
            labels=tuple(labels),
            mandatory_labels=tuple(normalise_labels(token.mandatory_labels)),
            capacity=register.capacity,
            ephemeral=register.ephemeral or token.kind == "ephemeral",
        )
        # One hand-over per agent id at a time: an older connection whose disconnect is being handled
        # finishes it first (agent offline, its dispatched jobs requeued). Its transaction can lose
        # the race for the database to ours (SQLite's busy wait is not first-come-first-served), and
        # would then mark this live agent offline and requeue a job just dispatched to it.
        async with self._handover_lock(register.agent_id):
            # Take the id's slot before closing the older connection: its disconnect handler then sees
            # it was replaced and leaves the agent row and its jobs to this registration.
            previous = self.connections.get(register.agent_id)
            self.connections[register.agent_id] = connection
            try:
                if previous is not None:
                    await previous.close(p.CLOSE_REPLACED, "replaced by a newer connection")
                not_owned = await self.journal.register(connection, register)
                waiting: str | None = None
                if self.scaler_link is not None:
                    waiting = await self.scaler_link.agent_registered(register.agent_id)
                    connection.bound = self.scaler_link.bound_job(register.agent_id)
                # An ephemeral agent back with the job it holds (a reconnect) has had its one dispatch.
                connection.dispatched = connection.single_use and bool(connection.jobs)
            except BaseException:
                if self.connections.get(register.agent_id) is connection:
                    del self.connections[register.agent_id]
                    self.dispatcher.agents.pop(register.agent_id, None)
                raise
        await connection.send(
            p.RegisterAck(
                agent_id=register.agent_id,
                labels=list(labels),
                mandatory_labels=list(connection.mandatory_labels),
                pending_dispatch=waiting is not None,
                bound_job_id=connection.bound,
            )
        )
        for job_id in not_owned:
            await connection.send(p.JobCancel(job_id=job_id, reason="not_owned", force=True))
        self.dispatcher.agents[register.agent_id] = connection
        self.dispatcher.wake()
        return connection

    async def _refuse(self, websocket: WebSocket, reason: str) -> None:
        with contextlib.suppress(Exception):
            await websocket.send_text(p.AuthFailure(reason=reason).model_dump_json())
            await websocket.close(p.CLOSE_AUTH_FAILED, reason[:120])

    # --- messages

    async def _apply(self, connection: AgentConnection, message: Any) -> None:
        """Apply one message, retrying a transaction the database aborted (deadlock, serialisation).

        Each handler commits before it answers, so a retry repeats nothing the agent has seen; only
        an error that persists closes the connection (1011), and the agent's outbox replays later.
        """
        await retry_transient(
            lambda: self._on_message(connection, message),
            attempts=MESSAGE_ATTEMPTS,
            what=f"{getattr(message, 'type', 'message')} from agent {connection.agent_id}",
            log=log,
        )

    async def _on_message(self, connection: AgentConnection, message: Any) -> None:
        if self.connections.get(connection.agent_id) is not connection:
            # Replaced (4008) or closed while this frame was in flight: only the connection that holds
            # the agent id's registration may report; nothing is applied or acknowledged, so a
            # durable message stays in the agent's outbox for the connection that does.
            log.warning(
                "refused %s from a connection of agent %s that does not hold its registration",
                getattr(message, "type", "a message"),
                connection.agent_id,
            )
            await connection.close(p.CLOSE_REPLACED, "this connection does not hold the agent's registration")
            return
        await self.journal.apply(connection, message)

    async def _disconnected(self, connection: AgentConnection, code: int) -> None:
        """One transaction: agent offline; dispatched jobs requeued; running ones recovering
        (docs/design/execution.md §6)."""
        connection.closed = True
        async with self._handover_lock(connection.agent_id):
            if self.connections.get(connection.agent_id) is connection:
                del self.connections[connection.agent_id]
                self.dispatcher.agents.pop(connection.agent_id, None)
            else:
                return  # replaced by a newer connection, which now owns the jobs
            await self.journal.disconnected(connection, code)
        log.info("agent %s disconnected (%s)", connection.agent_id, code)
        if self.scaler_link is not None:
            self.scaler_link.agent_disconnected(connection.agent_id)

    def _handover_lock(self, agent_id: str) -> asyncio.Lock:
        """The lock that orders an agent id's registrations and disconnects (kept while in use)."""
        lock = self._handover_locks.get(agent_id)
        if lock is None:
            lock = self._handover_locks[agent_id] = asyncio.Lock()
        return lock

    # --- local sweep

    def wake(self) -> None:
        """Run the local sweep now (e.g. another coordinator set one of our agents' jobs `cancelling`)."""
        self._sweep.wake()

    async def sweep_once(self) -> None:
        """Dead agents (4004), passed ack deadlines (4031), and cancels for jobs our agents run."""
        now_mono = time.monotonic()
        for connection in list(self.connections.values()):
            if now_mono - connection.last_frame > self.settings.dead_after_ms / 1000:
                await connection.close(p.CLOSE_HEARTBEAT_TIMEOUT, "no frame within the dead-after interval")
        if self.connections:
            await self.journal.sweep(self.connections)

    async def kick_token(self, token_id: str) -> int:
        """Close this node's connections authenticated with a revoked token (4010); how many.

        The agent takes 4010 as final (it exits 3), and the token is refused at its next authentication.
        """
        kicked = [c for c in list(self.connections.values()) if c.token_id == token_id and not c.closed]
        for connection in kicked:
            log.info("closing agent %s: its token %s was revoked", connection.agent_id, token_id)
            await connection.close(p.CLOSE_AUTH_FAILED, "agent token revoked")
        return len(kicked)

    async def disconnect(self, agent_id: str) -> bool:
        """Operator disconnect (4006); False when the agent is not connected here."""
        connection = self.connections.get(agent_id)
        if connection is None:
            return False
        await connection.close(p.CLOSE_OPERATOR, "disconnected by an operator")
        return True


AGENT_HUB = PartKey[AgentHub]("agent_hub")
