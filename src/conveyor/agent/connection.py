"""The agent's side of `/ws` (docs/design/execution.md §6): handshake, message loop, heartbeats, reconnects,
replay.

`Connection.run` connects, authenticates (`auth.request`), registers (`agent.register`), replays the durable
outbox after `register.ack` and then hands every orchestrator message to the `Session` (the agent program)
until the connection closes. The close code decides what happens next (`close_action`): reconnect after a
backoff of 1 s doubling to 30 s with full jitter, or exit (3 on 4010, 4003 and 4008).

Outgoing order: while the connection is down (or the outbox is being replayed), messages are kept in a bounded
backlog — durable ones as references to their outbox entry — and sent after the replay, so the orchestrator
sees every durable entry in `oseq` order and a job's messages in the order the runner produced them.
Heartbeats are never kept. Log chunks written to a connection stay in a `LogResendWindow` until an answer to
a later frame proves them applied, and a new connection sends them again first (`log_resend.py`).

Clock, random source, sleep and the websocket `connect` are injectable for tests.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import pydantic
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI
from websockets.protocol import State

from conveyor.agent.log_resend import LogResendWindow
from conveyor.agent.outbox import Outbox
from conveyor.errors import ConveyorError
from conveyor.model import protocol as p

log = logging.getLogger(__name__)

BACKOFF_BASE_S = 1.0
BACKOFF_CAP_S = 30.0
DEFAULT_HEARTBEAT_S = 15.0
DEFAULT_DEAD_AFTER_S = 45.0
HANDSHAKE_TIMEOUT_S = 10.0
BACKLOG_MAX = 10_000
EXIT_AUTH = 3

RECONNECT_CODES = frozenset(
    {
        p.CLOSE_GOING_AWAY,
        p.CLOSE_TOO_BIG,
        p.CLOSE_INTERNAL,
        p.CLOSE_BAD_MESSAGE,
        p.CLOSE_HANDSHAKE_TIMEOUT,
        p.CLOSE_HEARTBEAT_TIMEOUT,
        p.CLOSE_OPERATOR,
        p.CLOSE_ACK_TIMEOUT,
    }
)
EXIT_CODES = frozenset({p.CLOSE_AUTH_FAILED, p.CLOSE_PROTOCOL_UNSUPPORTED, p.CLOSE_REPLACED})


def backoff_ceiling(attempt: int, base: float = BACKOFF_BASE_S, cap: float = BACKOFF_CAP_S) -> float:
    """The upper bound of the wait before reconnect attempt `attempt` (0-based): 1, 2, 4, … 30 s."""
    return float(min(cap, base * 2 ** min(attempt, 32)))


def backoff_delay(
    attempt: int, rng: random.Random, base: float = BACKOFF_BASE_S, cap: float = BACKOFF_CAP_S
) -> float:
    """Full jitter: uniform in [0, ceiling(attempt)]."""
    return rng.uniform(0.0, backoff_ceiling(attempt, base, cap))


def close_action(code: int | None, *, draining: bool, ephemeral: bool, idle: bool) -> int | None:
    """What a close with `code` means for the agent: an exit code, or None to reconnect.

    1000 ends a draining or ephemeral agent once it runs nothing (a job still running reconnects to report);
    4010, 4003 and 4008 (received on the current connection, the only one the agent holds) exit 3; every
    other code — and an abnormal close without one — reconnects after the backoff.
    """
    if code in EXIT_CODES:
        return EXIT_AUTH
    if code == p.CLOSE_NORMAL and (draining or ephemeral) and idle:
        return 0
    return None


class Session(Protocol):
    """What the connection asks of the agent program."""

    def register_message(self) -> p.AgentRegister:
        """`agent.register` for a fresh connection (in-flight jobs, unacknowledged jobs)."""

    def heartbeat_message(self, ts_ms: float) -> p.Heartbeat:
        """A `heartbeat` at `ts_ms`."""

    async def on_message(self, message: p.OrchestratorMessage) -> None:
        """One orchestrator message after the handshake."""

    def close_state(self) -> tuple[bool, bool, bool]:
        """(draining, ephemeral, idle) for `close_action`."""


@dataclass
class ConnectionSettings:
    """Where and how to connect."""

    url: str
    token: str
    version: str = ""
    heartbeat_s: float | None = None  # None: the orchestrator's `heartbeat_ms`
    dead_after_s: float = DEFAULT_DEAD_AFTER_S
    handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S
    max_message_bytes: int | None = 64 * 1024 * 1024


class HandshakeRefused(ConveyorError):
    """`auth.failure` (or a close the agent must not retry) during the handshake."""


class Connection:
    """One agent's connection to the orchestrator, re-established until an exit is decided."""

    def __init__(
        self,
        settings: ConnectionSettings,
        outbox: Outbox,
        session: Session,
        *,
        rng: random.Random | None = None,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        clock: Callable[[], float] = time.time,
        connector: Callable[..., Any] = connect,
    ) -> None:
        self.settings = settings
        self.outbox = outbox
        self.session = session
        self.rng = rng or random.Random()
        self.sleep = sleep
        self.clock = clock
        self.connector = connector
        self.ws: ClientConnection | None = None
        self.ready = False  # registered and the outbox replayed: sends go straight out
        self.attempt = 0
        self.connections = 0
        self.backlog: collections.deque[dict[str, Any] | int] = collections.deque()
        self.log_window = LogResendWindow(BACKLOG_MAX)
        self._stop_code: int | None = None
        self._stopping = asyncio.Event()
        self.connected = asyncio.Event()

    # -- sending ------------------------------------------------------------------------------------

    async def send(self, message: p.Message) -> None:
        """A non-durable message: sent now when ready, else kept (bounded) for after the replay."""
        document = message.model_dump(mode="json")
        if message.__class__ is p.Heartbeat:
            if self.ready:
                await self._send_now(document, keep=False)
            return
        if not self.ready:
            self._keep(document)
            return
        await self._send_now(document, keep=True)

    async def send_durable(self, entry: Mapping[str, Any]) -> None:
        """An outbox entry (already fsync'ed): sent now when ready, else replayed after the next register."""
        if not self.ready:
            self._keep(int(entry["oseq"]))
            return
        await self._send_now(dict(entry), keep=True)

    def _keep(self, item: dict[str, Any] | int) -> None:
        if len(self.backlog) >= BACKLOG_MAX:
            # Drop the oldest non-durable message; durable ones live in the outbox anyway.
            for index, old in enumerate(self.backlog):
                if not isinstance(old, int):
                    del self.backlog[index]
                    break
            else:
                self.backlog.popleft()
        self.backlog.append(item)

    async def _send_now(self, document: Mapping[str, Any], *, keep: bool) -> None:
        ws = self.ws
        if ws is None:
            if keep:
                self._keep(int(document["oseq"]) if "oseq" in document else dict(document))
            return
        try:
            await self._write(ws, document)
        except ConnectionClosed:
            if keep:
                self._keep(int(document["oseq"]) if "oseq" in document else dict(document))

    async def _write(self, ws: ClientConnection, document: Mapping[str, Any]) -> None:
        await ws.send(json.dumps(document, separators=(",", ":"), default=str))
        self.log_window.wrote(document)

    async def _replay(self, ws: ClientConnection) -> None:
        """Resend the log chunks not known to be applied, the unacknowledged entries in oseq order, then the
        backlog; then go live. The chunks go first: a chunk kept in the backlog continues the same steps."""
        resend = self.log_window.take()
        for index, chunk in enumerate(resend):
            try:
                await self._write(ws, chunk)
            except ConnectionClosed:
                self.log_window.keep_unsent(resend[index:])
                raise
        in_backlog = {item for item in self.backlog if isinstance(item, int)}
        for entry in self.outbox.pending():
            if entry["oseq"] not in in_backlog:
                await self._write(ws, entry)
        while self.backlog:
            item = self.backlog[0]
            if isinstance(item, int):
                pending = self.outbox.entries.get(item)
                if pending is not None:
                    await self._write(ws, pending)
            else:
                await self._write(ws, item)
            self.backlog.popleft()
        self.ready = True

    # -- lifecycle ----------------------------------------------------------------------------------

    async def stop(self, code: int = 0) -> None:
        """End `run` with exit `code`, closing the connection normally (1000)."""
        if self._stop_code is None:
            self._stop_code = code
        self._stopping.set()
        ws = self.ws
        if ws is not None:
            try:
                await ws.close(p.CLOSE_NORMAL, "agent stopping")
            except Exception:
                pass

    async def run(self) -> int:
        """Connect, serve, reconnect; the exit code once an exit is decided."""
        while True:
            if self._stop_code is not None:
                return self._stop_code
            code, exit_code = await self._connect_once()
            if self._stop_code is not None:
                return self._stop_code
            if exit_code is not None:
                return exit_code
            draining, ephemeral, idle = self.session.close_state()
            action = close_action(code, draining=draining, ephemeral=ephemeral, idle=idle)
            if action is not None:
                log.info("connection closed with %s: exiting with %d", code, action)
                return action
            delay = backoff_delay(self.attempt, self.rng)
            self.attempt += 1
            log.info("connection closed (%s); reconnecting in %.1fs", code, delay)
            if await self._sleep_or_stop(delay):
                return self._stop_code if self._stop_code is not None else 0

    async def _sleep_or_stop(self, seconds: float) -> bool:
        """Sleep; True when `stop` was called meanwhile."""
        sleeper = asyncio.ensure_future(self.sleep(seconds))
        stopper = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({sleeper, stopper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeper.cancel()
            stopper.cancel()
        return self._stopping.is_set()

    async def _connect_once(self) -> tuple[int | None, int | None]:
        """One connection from connect to close: (its close code or None, an exit code decided inside)."""
        self.connections += 1
        try:
            ws = await self.connector(
                self.settings.url,
                open_timeout=self.settings.handshake_timeout_s,
                max_size=self.settings.max_message_bytes,
                close_timeout=2,
            )
        except InvalidURI as error:
            log.error("bad orchestrator URL %s: %s", self.settings.url, error)
            return None, 2
        except (OSError, InvalidHandshake, TimeoutError) as error:
            log.warning("cannot connect to %s: %s", self.settings.url, error)
            return None, None
        heartbeat: asyncio.Task[None] | None = None
        try:
            try:
                heartbeat_s = await self._handshake(ws)
            except TimeoutError:
                log.warning("handshake timed out")
                return None, None
            self.attempt = 0
            if self._stopping.is_set():
                return None, self._stop_code
            self.ws = ws
            await self._replay(ws)
            self.connected.set()
            heartbeat = asyncio.create_task(self._heartbeats(heartbeat_s))
            await self._receive(ws)
            return None, None  # silent for too long: reconnect
        except HandshakeRefused as refused:
            log.error("the orchestrator refused this agent: %s", refused)
            return p.CLOSE_AUTH_FAILED, EXIT_AUTH
        except ConnectionClosed as closed:
            return (closed.rcvd.code if closed.rcvd is not None else None), None
        finally:
            self.ready = False
            self.ws = None
            self.log_window.connection_lost()
            self.connected.clear()
            if heartbeat is not None:
                heartbeat.cancel()
            if ws.state is not State.CLOSED:
                try:
                    await ws.close(p.CLOSE_NORMAL)
                except Exception:
                    pass

    async def _recv(self, ws: ClientConnection, timeout: float) -> p.OrchestratorMessage | None:
        async with asyncio.timeout(timeout):
            raw = await ws.recv()
        try:
            return p.parse_orchestrator_message(raw)
        except pydantic.ValidationError as error:
            log.warning("ignoring an unreadable orchestrator message: %s", error.errors()[:1])
            return None

    async def _handshake(self, ws: ClientConnection) -> float:
        """auth.request and agent.register in one flight, then auth.success and register.ack; the heartbeat
        interval.

        The register does not wait for auth.success (one round trip instead of two): the orchestrator
        reads it after answering the auth.request, and ignores it when it refuses the token.
        """
        timeout = self.settings.handshake_timeout_s
        await ws.send(
            p.AuthRequest(token=self.settings.token, version=self.settings.version).model_dump_json()
        )
        await ws.send(self.session.register_message().model_dump_json())
        answer = await self._recv(ws, timeout)
        if isinstance(answer, p.AuthFailure):
            raise HandshakeRefused(answer.reason)
        if not isinstance(answer, p.AuthSuccess):
            raise HandshakeRefused(f"unexpected answer to auth.request: {answer!r}")
        heartbeat_s = self.settings.heartbeat_s or (answer.heartbeat_ms / 1000) or DEFAULT_HEARTBEAT_S
        answer = await self._recv(ws, timeout)
        if isinstance(answer, p.AuthFailure):
            raise HandshakeRefused(answer.reason)
        if not isinstance(answer, p.RegisterAck):
            raise HandshakeRefused(f"unexpected answer to agent.register: {answer!r}")
        log.info("registered as %s with labels %s", answer.agent_id, ", ".join(answer.labels))
        return heartbeat_s

    async def _receive(self, ws: ClientConnection) -> None:
        """Serve until the connection closes (raises ConnectionClosed) or goes silent (returns)."""
        while True:
            try:
                message = await self._recv(ws, self.settings.dead_after_s)
            except TimeoutError:
                log.warning("no frame for %.0fs: reconnecting", self.settings.dead_after_s)
                return
            if message is None:
                continue
            if isinstance(message, p.AuthFailure):
                raise HandshakeRefused(message.reason)
            self.log_window.answered(message)
            await self.session.on_message(message)

    async def _heartbeats(self, interval: float) -> None:
        while True:
            await self.sleep(interval)
            await self.send(self.session.heartbeat_message(self.clock() * 1000))
