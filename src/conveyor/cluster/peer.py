"""One authenticated peer session (either end) over a socket, and the two socket adapters.

The acceptor side runs on Starlette's `WebSocket`, the dialer side on a `websockets` client
connection; `FrameSocket` is the seam so the session logic is written once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from pydantic import BaseModel
from starlette.websockets import WebSocket, WebSocketDisconnect
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from conveyor.cluster.channel import CLOSE_PROTOCOL, ProtocolViolation, SecureSession
from conveyor.cluster.messages import InvalidMessage, PeerError, PeerMessage, parse_message
from conveyor.errors import ConveyorError

log = logging.getLogger(__name__)


class SocketClosed(ConveyorError):
    """The other end closed the socket (or it broke)."""

    def __init__(self, code: int | None, reason: str = "") -> None:
        super().__init__(f"closed with {code} {reason}".strip())
        self.code = code
        self.reason = reason


class FrameSocket(Protocol):
    """What a peer session needs of a WebSocket."""

    remote: str | None

    async def send_text(self, data: str) -> None:
        """Send a text frame."""

    async def send_bytes(self, data: bytes) -> None:
        """Send a binary frame."""

    async def receive(self) -> str | bytes:
        """The next frame; `SocketClosed` when the socket closed."""

    async def close(self, code: int, reason: str = "") -> None:
        """Close with `code` (idempotent)."""


class StarletteSocket:
    """`FrameSocket` over an accepted Starlette WebSocket (the acceptor)."""

    def __init__(self, websocket: WebSocket) -> None:
        self._ws = websocket
        self.remote = websocket.client.host if websocket.client else None
        self._closed = False

    async def send_text(self, data: str) -> None:
        """Send a text frame."""
        try:
            await self._ws.send_text(data)
        except (WebSocketDisconnect, RuntimeError) as exc:
            raise SocketClosed(getattr(exc, "code", None)) from exc

    async def send_bytes(self, data: bytes) -> None:
        """Send a binary frame."""
        try:
            await self._ws.send_bytes(data)
        except (WebSocketDisconnect, RuntimeError) as exc:
            raise SocketClosed(getattr(exc, "code", None)) from exc

    async def receive(self) -> str | bytes:
        """The next frame."""
        try:
            message = await self._ws.receive()
        except RuntimeError as exc:
            raise SocketClosed(None) from exc
        if message["type"] == "websocket.disconnect":
            self._closed = True
            raise SocketClosed(message.get("code"), message.get("reason") or "")
        if message.get("bytes") is not None:
            return bytes(message["bytes"])
        return str(message.get("text") or "")

    async def close(self, code: int, reason: str = "") -> None:
        """Close once."""
        if self._closed:
            return
        self._closed = True
        try:
            await self._ws.close(code=code, reason=reason[:120])
        except Exception:  # already gone
            pass


class ClientSocket:
    """`FrameSocket` over a `websockets` client connection (the dialer)."""

    def __init__(self, connection: ClientConnection) -> None:
        self._conn = connection
        self.remote: str | None = None

    async def send_text(self, data: str) -> None:
        """Send a text frame."""
        try:
            await self._conn.send(data)
        except ConnectionClosed as exc:
            raise SocketClosed(exc.rcvd.code if exc.rcvd else None) from exc

    async def send_bytes(self, data: bytes) -> None:
        """Send a binary frame."""
        try:
            await self._conn.send(data)
        except ConnectionClosed as exc:
            raise SocketClosed(exc.rcvd.code if exc.rcvd else None) from exc

    async def receive(self) -> str | bytes:
        """The next frame."""
        try:
            return await self._conn.recv()
        except ConnectionClosed as exc:
            raise SocketClosed(
                exc.rcvd.code if exc.rcvd else None, exc.rcvd.reason if exc.rcvd else ""
            ) from exc

    async def close(self, code: int, reason: str = "") -> None:
        """Close (idempotent in `websockets`)."""
        try:
            await self._conn.close(code=code, reason=reason[:120])
        except Exception:
            pass


async def receive_sealed(socket: FrameSocket, secure: SecureSession) -> dict[str, Any]:
    """The next binary frame, opened; a text frame after the handshake is a protocol violation."""
    frame = await socket.receive()
    if isinstance(frame, str):
        raise ProtocolViolation("a text frame after the handshake")
    return secure.opener.open(frame)


MessageHandler = Callable[["PeerSession", PeerMessage], Awaitable[None]]


@dataclass(eq=False)
class PeerSession:
    """An authenticated session with one peer: ordered sealed sends, and a reader that applies frames."""

    socket: FrameSocket
    secure: SecureSession
    peer_id: str
    peer_role: str
    credential_id: str | None
    side: str  # "acceptor" | "dialer"
    clock: Callable[[], float] = time.monotonic
    # The URL the dialer reached the peer at (`http(s)://…`; None on the acceptor's side): a worker sends the
    # HTTP routes it proxies for its agents there (docs/design/artifacts.md §4).
    url: str | None = None
    # The credential row's expiry (acceptor side, proof path): when ≤ 30 d are left it is rotated.
    credential_expires_at: datetime | None = None
    last_heard: float = field(default=0.0)
    close_code: int | None = None
    _send_lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def __post_init__(self) -> None:
        self.last_heard = self.clock()

    async def send(self, message: BaseModel | dict[str, Any]) -> None:
        """Seal and send one message; sealing and sending under one lock keeps `seq` in send order."""
        data = (
            message.model_dump(mode="json", exclude_none=True) if isinstance(message, BaseModel) else message
        )
        async with self._send_lock:
            await self.socket.send_bytes(self.secure.sealer.seal(data))

    async def close(self, code: int, reason: str = "") -> None:
        """Close the socket with `code` (the first code given is the one recorded)."""
        if self.close_code is None:
            self.close_code = code
        await self.socket.close(code, reason)

    async def read(self, handle: MessageHandler) -> int | None:
        """Apply frames until the socket closes; the close code (4400 after a protocol violation)."""
        while True:
            try:
                data = await receive_sealed(self.socket, self.secure)
            except ProtocolViolation as exc:
                log.warning("peer %s broke the protocol: %s", self.peer_id, exc)
                await self.close(CLOSE_PROTOCOL, "protocol violation")
                return CLOSE_PROTOCOL
            except SocketClosed as exc:
                return self.close_code or exc.code
            self.last_heard = self.clock()
            try:
                message = parse_message(data)
            except InvalidMessage as exc:
                log.warning(
                    "dropped an invalid %s from peer %s: %s", exc.message_type, self.peer_id, exc.detail
                )
                if exc.message_id is not None:
                    await self.send(PeerError(message_id=exc.message_id, error="invalid", detail=exc.detail))
                continue
            if message is not None:
                await handle(self, message)
