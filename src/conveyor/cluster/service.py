"""The node's peer hub: accepts `/ws/peer`, dials coordinators, heartbeats, staleness, revocation.

A coordinator accepts sessions (workers and lower-id sibling coordinators dial it) and dials every
live sibling coordinator with a higher instance id, so each pair shares one socket. A worker dials
every configured coordinator. Both ends send `peer.heartbeat` right after authentication and then
every interval; a session not heard from for `stale_beats` intervals is closed and its peer marked
disconnected.

Authentication as a dialer and credential rotation are `credentials.py`'s (`PeerCredentials`); the stale,
revocation and discovery loops `upkeep.py`'s (`PeerUpkeep`). The hub owns the sessions they act on.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from starlette.websockets import WebSocket
from websockets.asyncio.client import connect

from conveyor.cluster.auth import AUTH_TIMEOUT_S, PeerAuthenticator
from conveyor.cluster.channel import (
    CLOSE_AUTH_TIMEOUT,
    CLOSE_LEAVING,
    CLOSE_PROTOCOL,
    CLOSE_REPLACED,
    CLOSE_REVOKED,
    CLOSE_UNAUTHORIZED,
    AcceptorHandshake,
    ProtocolViolation,
    dialer_handshake,
    parse_plaintext,
)
from conveyor.cluster.credentials import PeerCredentials
from conveyor.cluster.messages import (
    AgentInventory,
    AuthRequest,
    AuthResponse,
    CredentialRotate,
    CredentialRotateAck,
    Heartbeat,
    InvalidMessage,
    IssuedCredential,
    LeaseInfo,
    Leaving,
    PeerError,
    PeerMessage,
    Revoked,
    ScalerInventory,
    parse_message,
)
from conveyor.cluster.peer import ClientSocket, PeerSession, SocketClosed, StarletteSocket, receive_sealed
from conveyor.cluster.registry import PeerRegistry
from conveyor.cluster.upkeep import PeerUpkeep
from conveyor.db.engine import Database, retry_transient
from conveyor.errors import ConveyorError
from conveyor.model.ids import format_rfc3339, utc_now

log = logging.getLogger(__name__)

BACKOFF_BASE_S = 1.0
BACKOFF_FACTOR = 1.5
BACKOFF_CAP_S = 60.0
REVOCATION_CHECK_MS = 60_000
# Job-path messages read ahead of the one being applied (then reading waits: backpressure).
JOB_INBOX_MESSAGES = 1024
# How long a closed session's remaining job-path messages may take to apply.
JOB_INBOX_DRAIN_S = 10.0
# Tries of one job-path message on transient database errors (as the agent hub's frames).
JOB_MESSAGE_ATTEMPTS = 5
CLOSE_TRY_AGAIN = 1013

# Answers a request message (one with a `message_id`) from a session; the reply is sent back on it.
RequestHandler = Callable[[PeerSession, Any], Awaitable[Any]]


class PeerUnavailable(ConveyorError):
    """No live session to that peer, or it closed before answering."""


def reconnect_delay(
    attempt: int,
    jitter: float,
    *,
    base_s: float = BACKOFF_BASE_S,
    factor: float = BACKOFF_FACTOR,
    cap_s: float = BACKOFF_CAP_S,
) -> float:
    """Seconds before reconnect `attempt` (0-based): base × factor^attempt, plus 0–50 % jitter, capped.

    `jitter` is a uniform draw in [0, 1); the jitter spreads a fleet's reconnects after a coordinator
    restart instead of having every worker knock at once.
    """
    delay = base_s * factor ** min(attempt, 64)
    return min(cap_s, delay * (1 + 0.5 * jitter))


def peer_socket_url(base_url: str) -> str:
    """`ws(s)://host:port/ws/peer` from a coordinator's `http(s)://` URL."""
    parts = urlsplit(base_url.strip())
    scheme = {"http": "ws", "https": "wss", "ws": "ws", "wss": "wss"}.get(parts.scheme)
    if scheme is None or not parts.netloc:
        raise ValueError(f"{base_url!r} is not an http(s):// or ws(s):// URL")
    path = parts.path.rstrip("/")
    if not path.endswith("/ws/peer"):
        path += "/ws/peer"
    return urlunsplit((scheme, parts.netloc, path, "", ""))


@dataclass(frozen=True)
class HubIdentity:
    """Who this node is on the peer channel."""

    instance_id: str
    role: str
    software_version: str
    advertise_url: str | None


@dataclass
class HubSettings:
    """Timings (env in production, short ones in tests)."""

    heartbeat_interval_ms: int
    stale_beats: int
    auth_timeout_s: float = AUTH_TIMEOUT_S
    revocation_check_ms: int = REVOCATION_CHECK_MS
    ws_max_message_bytes: int = 4 * 1024 * 1024


@dataclass
class PeerHub:
    """Every peer session of this node, and the loops that keep them honest."""

    identity: HubIdentity
    settings: HubSettings
    home: Path
    registry: PeerRegistry = field(default_factory=PeerRegistry)
    db: Database | None = None
    authenticator: PeerAuthenticator | None = None
    join_token: str | None = None
    settings_version: Callable[[], Awaitable[int]] | None = None
    lease_info: Callable[[], LeaseInfo | None] = lambda: None
    secret_key_fingerprint: Callable[[], str | None] = lambda: None
    # This node's agents and scalers, for its heartbeats (docs/design/cluster.md §2.3); read at each beat.
    inventory: Callable[[], tuple[list[AgentInventory], list[ScalerInventory]]] = lambda: ([], [])
    # Only the lease holder rotates credentials, so two coordinators never rotate one peer at once.
    is_leader: Callable[[], bool] = lambda: False
    on_session_closed: Callable[[str, int | None], None] = lambda peer, code: None
    # Whether this node drains (docs/design/cluster.md §8), for its heartbeats.
    draining: Callable[[], bool] = lambda: False
    # Called with (session, heartbeat) for every accepted heartbeat a peer sends (the settings puller,
    # the job path's capacity view).
    heartbeat_observers: list[Callable[[PeerSession, Heartbeat], None]] = field(default_factory=list)
    # The job path (docs/design/cluster.md §4): called with every message the hub itself does not handle;
    # wired by the reroute service (coordinators) or the worker service.
    job_messages: Callable[[PeerSession, PeerMessage], Awaitable[bool]] | None = None
    # Called at once with each job-path message as it is read, before it waits in the session's inbox
    # behind slower ones: what must not wait there (an offer's ack stops the offer's timer).
    job_arrivals: Callable[[PeerSession, PeerMessage], None] | None = None
    # Sessions opened (after authentication), for the job path's replay and capacity.
    on_session_opened: Callable[[PeerSession], Awaitable[None]] | None = None
    rng: Callable[[], float] = random.random
    clock: Callable[[], float] = time.monotonic
    sessions: dict[str, PeerSession] = field(default_factory=dict)
    # The dialer's last refusal per coordinator URL (reason), for logs and `/cluster/health`.
    refusals: dict[str, str] = field(default_factory=dict)
    coordinator_urls: list[str] = field(default_factory=list)
    _dialers: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    # Request types this node answers (by message `type`), registered by the features that own them.
    request_handlers: dict[str, RequestHandler] = field(default_factory=dict)
    # Requests this node sent and awaits, by (peer, message_id): only that peer's reply resolves one.
    _pending: dict[tuple[str, str], asyncio.Future[Any]] = field(default_factory=dict)
    _handling: set[asyncio.Task[None]] = field(default_factory=set)
    _stopping: bool = False
    # Authentication as a dialer and credential rotation; the stale, revocation and discovery loops.
    credentials: PeerCredentials = field(init=False, repr=False, compare=False)
    upkeep: PeerUpkeep = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.credentials = PeerCredentials(self)
        self.upkeep = PeerUpkeep(self)

    # --- lifecycle

    async def start(self) -> None:
        """Seed the registry (coordinators), start the loops and the dialers."""
        if self.db is not None:
            await self._discover_siblings()
            self._tasks.append(asyncio.create_task(self.upkeep.discovery_loop(), name="peer-discovery"))
            self._tasks.append(asyncio.create_task(self.upkeep.revocation_loop(), name="peer-revocation"))
        self._tasks.append(asyncio.create_task(self.upkeep.stale_loop(), name="peer-stale"))
        for url in self.coordinator_urls:
            self.dial(url, url)

    async def stop(self) -> None:
        """Say `peer.leaving` on every session, close them (4410) and end every loop."""
        self._stopping = True
        for task in [*self._tasks, *self._dialers.values(), *self._handling]:
            task.cancel()
        for session in list(self.sessions.values()):
            try:
                async with asyncio.timeout(1):
                    await session.send(Leaving(instance_id=self.identity.instance_id, reason="shutdown"))
            except Exception:
                pass
            await session.close(CLOSE_LEAVING, "leaving")
        await asyncio.gather(*self._tasks, *self._dialers.values(), return_exceptions=True)

    # --- requests and their replies

    def handle(self, message_type: str, handler: RequestHandler) -> None:
        """Answer requests of `message_type` with `handler` (its return value is sent back; None: no reply)."""
        self.request_handlers[message_type] = handler

    async def request(self, peer_id: str, message: Any, timeout_s: float) -> Any:
        """Send a request (a message with `message_id`) to `peer_id` and wait for its reply.

        Raises `PeerUnavailable` when there is no session or it closes first, `TimeoutError` past
        `timeout_s`. A `peer.error` answer is returned like any reply: the caller decides.
        """
        session = self.sessions.get(peer_id)
        if session is None:
            raise PeerUnavailable(peer_id)
        key = (peer_id, message.message_id)
        reply: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[key] = reply
        try:
            try:
                await session.send(message)
            except SocketClosed as exc:
                raise PeerUnavailable(peer_id) from exc
            async with asyncio.timeout(timeout_s):
                return await reply
        finally:
            self._pending.pop(key, None)

    def _resolve_reply(self, session: PeerSession, message: Any) -> bool:
        """Hand a reply to the request waiting for it; whether one was."""
        message_id = getattr(message, "message_id", None)
        if not isinstance(message_id, str) or message.type in self.request_handlers:
            return False
        waiting = self._pending.get((session.peer_id, message_id))
        if waiting is None or waiting.done():
            return False
        waiting.set_result(message)
        return True

    def _answer(self, session: PeerSession, message: Any, handler: RequestHandler) -> None:
        """Run a request's handler off the read loop, so a slow one does not delay heartbeats."""

        async def answer() -> None:
            try:
                reply = await handler(session, message)
            except Exception as exc:
                log.exception("handling %s from %s failed", message.type, session.peer_id)
                reply = PeerError(
                    message_id=getattr(message, "message_id", None), error="error", detail=str(exc)
                )
            if reply is None:
                return
            try:
                await session.send(reply)
            except SocketClosed:
                log.info("peer %s left before the answer to its %s", session.peer_id, message.type)

        task = asyncio.create_task(answer(), name=f"peer-answer-{message.type}")
        self._handling.add(task)
        task.add_done_callback(self._handling.discard)

    def _fail_pending(self, peer_id: str) -> None:
        for (peer, _), waiting in list(self._pending.items()):
            if peer == peer_id and not waiting.done():
                waiting.set_exception(PeerUnavailable(peer_id))

    # --- what routes ask

    def session_for(self, instance_id: str) -> PeerSession | None:
        """The live session of a peer, if any."""
        return self.sessions.get(instance_id)

    def connected(self, role: str | None = None) -> list[str]:
        """Instance ids of peers with a live session (optionally of one role)."""
        return sorted(pid for pid, s in self.sessions.items() if role is None or s.peer_role == role)

    async def revoke(self, instance_id: str) -> int:
        """Close this node's sessions of a revoked peer (4403), tell connected coordinators; how many closed."""
        closed = await self.close_sessions(instance_id, CLOSE_REVOKED, "credential revoked")
        for session in list(self.sessions.values()):
            if session.peer_role == "coordinator" and session.peer_id != instance_id:
                try:
                    await session.send(Revoked(instance_id=instance_id))
                except SocketClosed:
                    pass
        return closed

    async def close_sessions(self, instance_id: str, code: int, reason: str) -> int:
        """Close this node's session of `instance_id` (if any) with `code`; how many closed."""
        session = self.sessions.pop(instance_id, None)
        if session is None:
            return 0
        self.registry.disconnected(instance_id)
        await session.close(code, reason)
        return 1

    # --- acceptor

    async def accept(self, websocket: WebSocket) -> None:
        """Run one `/ws/peer` connection: handshake, authentication (within 15 s), then the session."""
        await websocket.accept()
        socket = StarletteSocket(websocket)
        if self.authenticator is None:
            await socket.close(CLOSE_UNAUTHORIZED, "this node does not accept peers")
            return
        try:
            async with asyncio.timeout(self.settings.auth_timeout_s):
                handshake = AcceptorHandshake()
                await socket.send_text(json.dumps(handshake.hello()))
                first = await socket.receive()
                if isinstance(first, bytes):
                    raise ProtocolViolation("expected the plaintext peer.hello.response")
                secure = handshake.complete(parse_plaintext(first))
                request = parse_message(await receive_sealed(socket, secure))
                if not isinstance(request, AuthRequest):
                    raise ProtocolViolation("expected peer.auth.request")
                outcome = await self.authenticator.authenticate(request, th=secure.th, remote=socket.remote)
        except TimeoutError:
            log.info("a peer did not authenticate within %.0f s", self.settings.auth_timeout_s)
            await socket.close(CLOSE_AUTH_TIMEOUT, "authentication timed out")
            return
        except (ProtocolViolation, InvalidMessage) as exc:
            log.warning("refused a peer from %s: %s", socket.remote, exc)
            await socket.close(CLOSE_PROTOCOL, "protocol violation")
            return
        except SocketClosed:
            return
        except Exception as exc:  # e.g. the database is unreachable: fail closed, the dialer retries
            log.warning("could not authenticate a peer from %s: %s", socket.remote, exc)
            await socket.close(CLOSE_TRY_AGAIN, "try again later")
            return
        issued = outcome.issued
        response = AuthResponse(
            accepted=outcome.accepted,
            reason=outcome.reason,
            instance_id=self.identity.instance_id,
            your_role=outcome.role,
            server_signature=outcome.server_signature,
            credential=IssuedCredential(secret=issued.secret, expires_at=issued.expires_at)
            if issued
            else None,
        )
        try:
            await socket.send_bytes(secure.sealer.seal(response.wire()))
        except SocketClosed:
            return
        if not outcome.accepted or outcome.role is None:
            log.warning("refused peer %s from %s: %s", request.instance_id, socket.remote, outcome.reason)
            await socket.close(outcome.close_code or CLOSE_UNAUTHORIZED, outcome.reason or "unauthorized")
            return
        session = PeerSession(
            socket,
            secure,
            request.instance_id,
            outcome.role,
            outcome.credential_id,
            "acceptor",
            clock=self.clock,
            credential_expires_at=outcome.expires_at,
        )
        await self._run_session(session)

    # --- dialer

    def dial(self, key: str, url: str) -> None:
        """Keep a session to the coordinator at `url` (reconnecting with backoff until stopped)."""
        existing = self._dialers.get(key)
        if existing is not None and not existing.done():
            return
        self._dialers[key] = asyncio.create_task(self._dial_forever(url), name=f"peer-dial-{key}")

    async def _dial_forever(self, url: str) -> None:
        attempt = 0
        while not self._stopping:
            try:
                if await self._dial_once(url):
                    attempt = 0
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.info("peer connection to %s failed: %s", url, exc)
            delay = reconnect_delay(attempt, self.rng())
            attempt += 1
            await asyncio.sleep(delay)

    async def _dial_once(self, url: str) -> bool:
        """One connection; True when a session was established (the backoff starts over)."""
        async with connect(
            peer_socket_url(url), open_timeout=10, max_size=self.settings.ws_max_message_bytes
        ) as connection:
            socket = ClientSocket(connection)
            try:
                hello = await socket.receive()
                response, secure = dialer_handshake(parse_plaintext(hello))
                await socket.send_text(json.dumps(response))
                async with asyncio.timeout(self.settings.auth_timeout_s):
                    reply = await self.credentials.authenticate(socket, secure, url)
                if reply is None:
                    return False
            except ProtocolViolation as exc:
                log.warning("coordinator %s broke the peer protocol: %s", url, exc)
                await socket.close(CLOSE_PROTOCOL, "protocol violation")
                return False
            except (SocketClosed, InvalidMessage) as exc:
                log.info("peer connection to %s ended during authentication: %s", url, exc)
                return False
            except TimeoutError:
                log.warning("coordinator %s did not answer the authentication in time", url)
                await socket.close(CLOSE_AUTH_TIMEOUT, "authentication timed out")
                return False
            self.refusals.pop(url, None)
            session = PeerSession(
                socket, secure, reply.instance_id, "coordinator", None, "dialer", clock=self.clock, url=url
            )
            code = await self._run_session(session)
            if code == CLOSE_REVOKED:
                log.error("coordinator %s closed our session: this node's credential was revoked", url)
            return True

    # --- both ends

    async def _run_session(self, session: PeerSession) -> int | None:
        peer = session.peer_id
        if peer == self.identity.instance_id:
            await session.close(CLOSE_UNAUTHORIZED, "a node cannot peer with itself")
            return CLOSE_UNAUTHORIZED
        previous = self.sessions.get(peer)
        self.sessions[peer] = session
        if previous is not None:
            await previous.close(CLOSE_REPLACED, "replaced by a newer session")
        self.registry.connected(peer, session.peer_role)
        log.info("peer %s connected (%s, %s)", peer, session.peer_role, session.side)
        beating = asyncio.create_task(self._beat(session), name=f"peer-beat-{peer}")
        await self.maybe_rotate(session)
        if self.on_session_opened is not None:
            try:
                await self.on_session_opened(session)
            except Exception:
                log.exception("the job path's session start for %s failed", peer)
        code: int | None = None
        # Job-path messages are applied in arrival order by their own task, so a slow database write
        # never holds up reading the heartbeats behind it (which would make the peer look stale).
        inbox: asyncio.Queue[PeerMessage | None] = asyncio.Queue(maxsize=JOB_INBOX_MESSAGES)
        applying = asyncio.create_task(self._apply_job_messages(session, inbox), name=f"peer-jobs-{peer}")

        async def on_message(current: PeerSession, message: PeerMessage) -> None:
            await self._on_message(current, message, inbox)

        try:
            code = await session.read(on_message)
        finally:
            beating.cancel()
            await asyncio.gather(beating, return_exceptions=True)
            if self.sessions.get(peer) is session:
                del self.sessions[peer]
                self.registry.disconnected(peer)
                self._fail_pending(peer)
            # What arrived before the close is still applied (a result is then acked on a later session).
            await inbox.put(None)
            try:
                async with asyncio.timeout(JOB_INBOX_DRAIN_S):
                    await asyncio.shield(applying)
            except TimeoutError:
                applying.cancel()
            await asyncio.gather(applying, return_exceptions=True)
            log.info("peer %s disconnected (close %s)", peer, code)
            self.on_session_closed(peer, code)
        return code

    async def heartbeat(self) -> Heartbeat:
        """This node's heartbeat now, with its connected agents and its scalers' capacity."""
        version = await self.settings_version() if self.settings_version else 0
        agents, scalers = self.inventory()
        return Heartbeat(
            agents=agents,
            scalers=scalers,
            instance_id=self.identity.instance_id,
            role=self.identity.role,
            at=format_rfc3339(utc_now()),
            software_version=self.identity.software_version,
            draining=self.draining(),
            cluster_settings_version=version,
            lease=self.lease_info() if self.identity.role == "coordinator" else None,
            secret_key_fingerprint=self.secret_key_fingerprint()
            if self.identity.role == "coordinator"
            else None,
        )

    async def _beat(self, session: PeerSession) -> None:
        while True:
            try:
                await session.send(await self.heartbeat())
            except SocketClosed:
                return
            except Exception as exc:  # a failed beat is retried at the next interval
                log.warning("heartbeat to %s failed: %s", session.peer_id, exc)
            await asyncio.sleep(self.settings.heartbeat_interval_ms / 1000)

    async def _apply_job_messages(
        self, session: PeerSession, inbox: asyncio.Queue[PeerMessage | None]
    ) -> None:
        while (message := await inbox.get()) is not None:
            try:
                handled = await self._apply_job_message(session, message)
            except Exception:
                log.exception("applying %s from peer %s failed", message.type, session.peer_id)
                continue
            if not handled:
                log.info("ignored %s from peer %s after authentication", message.type, session.peer_id)

    async def _apply_job_message(self, session: PeerSession, message: PeerMessage) -> bool:
        """One job-path message, retried while the database says a retry may succeed (a session ended under
        it, a deadlock, a busy pool): dropped, an ack, a `running` or a log chunk would be lost for good. The
        handlers' writes are guarded, so a retry repeats nothing that committed."""
        job_messages = self.job_messages
        if job_messages is None:
            return False
        return await retry_transient(
            lambda: job_messages(session, message),
            attempts=JOB_MESSAGE_ATTEMPTS,
            what=f"{message.type} from peer {session.peer_id}",
            log=log,
        )

    async def _on_message(
        self,
        session: PeerSession,
        message: PeerMessage,
        inbox: asyncio.Queue[PeerMessage | None] | None = None,
    ) -> None:
        if self._resolve_reply(session, message):
            return
        handler = self.request_handlers.get(message.type)
        if handler is not None:
            self._answer(session, message, handler)
            return
        if isinstance(message, Heartbeat):
            if message.instance_id != session.peer_id:
                log.warning("peer %s sent a heartbeat for %s; ignored", session.peer_id, message.instance_id)
                return
            self.registry.heard(message, role=session.peer_role)
            for observe in self.heartbeat_observers:
                observe(session, message)
        elif isinstance(message, Leaving):
            log.info("peer %s is leaving: %s", session.peer_id, message.reason)
            if self.sessions.get(session.peer_id) is session:
                del self.sessions[session.peer_id]
            self.registry.left(session.peer_id)
            await session.close(CLOSE_LEAVING, "leaving")
        elif isinstance(message, Revoked):
            # Only a coordinator (credential row role, or the acceptor we dialed) may kick peers.
            if session.peer_role != "coordinator":
                log.warning("ignored peer.revoked from %s (%s)", session.peer_id, session.peer_role)
                return
            await self.close_sessions(message.instance_id, CLOSE_REVOKED, "credential revoked")
        elif isinstance(message, CredentialRotate) and session.side == "dialer":
            await self.credentials.save_rotation(session, message)
        elif isinstance(message, CredentialRotateAck) and session.side == "acceptor":
            await self.credentials.commit_rotation(session)
        elif isinstance(message, PeerError):
            log.warning("peer %s answered an error: %s %s", session.peer_id, message.error, message.detail)
            if self.job_messages is not None and inbox is not None and message.message_id:
                await inbox.put(message)  # it may answer a job-path request (an invalid offer)
        elif self.job_messages is not None and inbox is not None:
            if self.job_arrivals is not None:
                self.job_arrivals(session, message)
            await inbox.put(message)
        else:
            log.info("ignored %s from peer %s after authentication", message.type, session.peer_id)

    # --- credentials (`credentials.py`) and upkeep (`upkeep.py`)

    async def maybe_rotate(self, session: PeerSession) -> bool:
        """Offer a new secret when the session's credential has ≤ 30 d left; whether one was sent."""
        return await self.credentials.maybe_rotate(session)

    async def offer_rotations(self) -> int:
        """`maybe_rotate` every live session (the leader's part; others return at once); how many were offered."""
        return await self.credentials.offer_rotations()

    async def check_stale(self) -> list[str]:
        """Close sessions whose peer missed `stale_beats` beats; their ids."""
        return await self.upkeep.check_stale()

    async def check_revocations(self) -> list[str]:
        """Backstop: close live sessions whose credential row was revoked; their peer ids."""
        return await self.upkeep.check_revocations()

    async def _discover_siblings(self) -> None:
        """One round of sibling discovery (`upkeep.PeerUpkeep.discover_siblings`)."""
        await self.upkeep.discover_siblings()
