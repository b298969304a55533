"""A scripted `/ws/peer` dialer for tests: does the real handshake, then sends exactly what a test says."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from conveyor.cluster.auth import credential_keys, encode_bytes, make_proof
from conveyor.cluster.channel import SecureSession, dialer_handshake
from conveyor.cluster.service import peer_socket_url


class ScriptedPeer:
    """One hand-driven peer connection."""

    def __init__(self, connection: ClientConnection, secure: SecureSession) -> None:
        self.connection = connection
        self.secure = secure

    @classmethod
    async def connect(cls, base_url: str) -> ScriptedPeer:
        """Open `/ws/peer` and complete the plaintext hello exchange."""
        connection = await connect(peer_socket_url(base_url), open_timeout=10)
        hello = json.loads(await connection.recv())
        response, secure = dialer_handshake(hello)
        await connection.send(json.dumps(response))
        return cls(connection, secure)

    def seal(self, message: dict[str, Any]) -> bytes:
        """The next frame for `message` (not sent: a test may hold it back, replay or reorder it)."""
        return self.secure.sealer.seal(message)

    async def send_frame(self, frame: bytes) -> None:
        """Send raw bytes as one binary frame."""
        await self.connection.send(frame)

    async def send(self, message: dict[str, Any]) -> None:
        """Seal and send."""
        await self.send_frame(self.seal(message))

    async def receive(self, timeout: float = 10) -> dict[str, Any]:
        """The next message from the acceptor, opened."""
        async with asyncio.timeout(timeout):
            frame = await self.connection.recv()
        assert isinstance(frame, bytes), frame
        return self.secure.opener.open(frame)

    async def receive_type(self, message_type: str, timeout: float = 10) -> dict[str, Any]:
        """Skip messages until one of `message_type` arrives."""
        async with asyncio.timeout(timeout):
            while True:
                message = await self.receive(timeout)
                if message.get("type") == message_type:
                    return message

    async def join(self, instance_id: str, token: str) -> dict[str, Any]:
        """Authenticate with a join token; the `peer.auth.response`."""
        await self.send(
            {
                "type": "peer.auth.request",
                "instance_id": instance_id,
                "software_version": "test",
                "join_token": token,
            }
        )
        return await self.receive_type("peer.auth.response")

    async def prove(
        self, instance_id: str, secret: bytes, *, client_key: bytes | None = None
    ) -> dict[str, Any]:
        """Authenticate with a proof from `secret` (or from a given `client_key`, e.g. a leaked verifier)."""
        keys = credential_keys(secret, instance_id)
        proof = make_proof(client_key or keys.client_key, keys.stored_key, self.secure.th, instance_id)
        await self.send(
            {
                "type": "peer.auth.request",
                "instance_id": instance_id,
                "software_version": "test",
                "proof": encode_bytes(proof),
            }
        )
        return await self.receive_type("peer.auth.response")

    async def closed_with(self, timeout: float = 10) -> int | None:
        """Read until the acceptor closes; its close code."""
        try:
            async with asyncio.timeout(timeout):
                while True:
                    await self.connection.recv()
        except ConnectionClosed as exc:
            return exc.rcvd.code if exc.rcvd else None

    async def close(self) -> None:
        """Close from this end."""
        await self.connection.close()
