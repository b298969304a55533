"""This node's peer credential (docs/design/cluster.md §2.2): the dialer joins with the join token or proves
with the saved credential (falling back to the previous one of an unfinished rotation), and saves a rotated
secret; the leader offers rotations on the sessions it accepted and commits them when acknowledged.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from conveyor.cluster import store
from conveyor.cluster.auth import (
    CREDENTIAL_TTL,
    SECRET_BYTES,
    SavedCredential,
    credential_keys,
    decode_bytes,
    encode_bytes,
    load_credential,
    make_proof,
    rotation_due,
    save_credential,
    server_signature,
)
from conveyor.cluster.channel import CLOSE_NORMAL, CLOSE_UNAUTHORIZED, ProtocolViolation, SecureSession
from conveyor.cluster.messages import (
    AuthRequest,
    AuthResponse,
    CredentialRotate,
    CredentialRotateAck,
    PeerError,
    parse_message,
)
from conveyor.cluster.peer import ClientSocket, PeerSession, SocketClosed, receive_sealed
from conveyor.model.ids import format_rfc3339, utc_now

if TYPE_CHECKING:
    from conveyor.cluster.service import PeerHub

log = logging.getLogger(__name__)


async def _close_code(socket: ClientSocket, timeout_s: float = 2.0) -> int | None:
    """The code the acceptor closes with after a refusal (None if it does not close in time)."""
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                await socket.receive()
    except SocketClosed as exc:
        return exc.code
    except TimeoutError:
        return None


@dataclass(frozen=True)
class PendingRotation:
    """A rotation sent to a peer and not acknowledged yet."""

    session: PeerSession
    previous_id: str
    secret: bytes
    expires_at: datetime


class PeerCredentials:
    """The peer hub's credential work: authenticating as a dialer, rotating as the leader's acceptor."""

    def __init__(self, hub: PeerHub) -> None:
        self.hub = hub
        # One join, proof fallback or rotation at a time per process: the saved file holds one credential.
        self.lock = asyncio.Lock()
        self.rotations: dict[str, PendingRotation] = {}

    async def authenticate(
        self, socket: ClientSocket, secure: SecureSession, url: str
    ) -> AuthResponse | None:
        """Prove with the saved credential, or join with the token; the accepted reply, or None (logged)."""
        me = self.hub.identity.instance_id
        saved = load_credential(self.hub.home, me)
        if saved is None:
            # One join at a time: two coordinators issuing a credential for one token at once would each
            # rotate the other's, and the file could end up holding the superseded one.
            async with self.lock:
                saved = load_credential(self.hub.home, me)  # another dialer may have joined meanwhile
                if saved is None:
                    return await self._join(socket, secure, url)
        return await self._prove(socket, secure, url, saved)

    def _request(self, **credential: str) -> AuthRequest:
        return AuthRequest(
            instance_id=self.hub.identity.instance_id,
            software_version=self.hub.identity.software_version,
            advertise_url=self.hub.identity.advertise_url,
            **credential,
        )

    async def _exchange(
        self, socket: ClientSocket, secure: SecureSession, url: str, request: AuthRequest
    ) -> AuthResponse:
        await socket.send_bytes(secure.sealer.seal(request.wire()))
        reply = parse_message(await receive_sealed(socket, secure))
        if not isinstance(reply, AuthResponse):
            raise ProtocolViolation("expected peer.auth.response")
        if not reply.accepted:
            self.hub.refusals[url] = reply.reason or "unauthorized"
            code = await _close_code(socket)
            log.warning("peer authentication refused by %s: %s (close %s)", url, reply.reason, code)
        return reply

    async def _join(self, socket: ClientSocket, secure: SecureSession, url: str) -> AuthResponse | None:
        me = self.hub.identity.instance_id
        if not self.hub.join_token:
            log.error(
                "cannot join %s: no saved peer credential and no join token (set CONVEYOR_CLUSTER_JOIN_TOKEN)",
                url,
            )
            await socket.close(CLOSE_NORMAL, "no credential")
            return None
        reply = await self._exchange(socket, secure, url, self._request(join_token=self.hub.join_token))
        if not reply.accepted:
            return None
        if reply.credential is None or decode_bytes(reply.credential.secret) is None:
            raise ProtocolViolation("an accepted join carried no credential")
        # Saved before the session is used (docs/design/cluster.md §2.2).
        save_credential(
            self.hub.home, SavedCredential(me, reply.credential.secret, reply.credential.expires_at)
        )
        log.info("joined the cluster through %s; credential saved", url)
        return reply

    async def _prove(
        self, socket: ClientSocket, secure: SecureSession, url: str, saved: SavedCredential
    ) -> AuthResponse | None:
        me = self.hub.identity.instance_id
        keys = credential_keys(saved.secret_bytes, me)
        proof = make_proof(keys.client_key, keys.stored_key, secure.th, me)
        reply = await self._exchange(socket, secure, url, self._request(proof=encode_bytes(proof)))
        if not reply.accepted:
            if saved.previous_secret and reply.reason == "proof_invalid":
                # The rotation this secret came from may never have committed: try the other one next
                # (swapped, not dropped, in case the commit was only late).
                log.warning("the saved peer credential was refused; trying the previous one next")
                async with self.lock:
                    save_credential(
                        self.hub.home,
                        SavedCredential(me, saved.previous_secret, saved.expires_at, saved.secret),
                    )
            return None
        expected = encode_bytes(server_signature(keys.server_key, secure.th, me))
        if reply.server_signature != expected:
            # Only a node holding this cluster's verifier can sign: anything else is an impostor.
            log.error("coordinator %s failed to prove it holds our verifier; closing", url)
            self.hub.refusals[url] = "server_signature_invalid"
            await socket.close(CLOSE_UNAUTHORIZED, "bad server signature")
            return None
        if saved.previous_secret:  # the rotated secret works: forget the old one
            async with self.lock:
                current = load_credential(self.hub.home, me)
                if current is not None and current.secret == saved.secret:
                    save_credential(self.hub.home, SavedCredential(me, saved.secret, saved.expires_at))
        return reply

    async def maybe_rotate(self, session: PeerSession) -> bool:
        """Offer a new secret when the session's credential has ≤ 30 d left; whether one was sent."""
        if (
            session.side != "acceptor"
            or session.credential_id is None
            or not self.hub.is_leader()
            or session.peer_id in self.rotations
            or not rotation_due(session.credential_expires_at, utc_now())
        ):
            return False
        secret = secrets.token_bytes(SECRET_BYTES)
        expires_at = utc_now() + CREDENTIAL_TTL
        self.rotations[session.peer_id] = PendingRotation(session, session.credential_id, secret, expires_at)
        try:
            await session.send(
                CredentialRotate(secret=encode_bytes(secret), expires_at=format_rfc3339(expires_at))
            )
        except SocketClosed:
            self.rotations.pop(session.peer_id, None)
            return False
        log.info("rotating the credential of peer %s", session.peer_id)
        return True

    async def save_rotation(self, session: PeerSession, message: CredentialRotate) -> None:
        """The dialer's side: save the rotated secret (keeping the old one until the new one works), then ack."""
        me = self.hub.identity.instance_id
        if decode_bytes(message.secret) is None:
            await session.send(PeerError(error="invalid", detail="the rotated secret is not base64url"))
            return
        # One rotation at a time per process; the old secret is kept until the new one has worked.
        async with self.lock:
            saved = load_credential(self.hub.home, me)
            previous = saved.secret if saved else None
            save_credential(self.hub.home, SavedCredential(me, message.secret, message.expires_at, previous))
        await session.send(CredentialRotateAck(instance_id=me))
        log.info("saved the rotated peer credential from %s", session.peer_id)

    async def commit_rotation(self, session: PeerSession) -> None:
        """The acceptor's side, on the peer's ack: the rotated credential row replaces the session's."""
        pending = self.rotations.get(session.peer_id)
        if pending is None or pending.session is not session or self.hub.db is None:
            log.warning("ignored an unexpected credential rotation ack from %s", session.peer_id)
            return
        del self.rotations[session.peer_id]
        keys = credential_keys(pending.secret, session.peer_id)
        async with self.hub.db.transaction() as conn:
            now = await store.database_now(conn)
            new_id = await store.rotate_credential(
                conn,
                previous_id=pending.previous_id,
                instance_id=session.peer_id,
                role=session.peer_role,
                stored_key=keys.stored_key,
                server_key=keys.server_key,
                now=now,
                expires_at=pending.expires_at,
                validated_by=self.hub.identity.instance_id,
            )
        if new_id is None:
            log.warning("the credential of %s changed during its rotation; rotation dropped", session.peer_id)
            return
        # The session stays up on its rotated row; the backstop now watches the new one.
        session.credential_id, session.credential_expires_at = new_id, pending.expires_at
        log.info("rotated the credential of peer %s", session.peer_id)

    async def offer_rotations(self) -> int:
        """`maybe_rotate` every live session (the leader's part; others return at once); how many were offered.

        A leader task (`cluster/startup.py`): run as soon as this node becomes leader, so a peer that
        proved while no coordinator led (between two leaders' terms) is not left waiting, then at every
        revocation-check interval, so long sessions rotate too (no expiry cliff).
        """
        offered = 0
        for session in list(self.hub.sessions.values()):
            offered += await self.maybe_rotate(session)
        return offered
