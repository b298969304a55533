"""Peer authentication (docs/design/cluster.md §2.2): join tokens, SCRAM-style credentials, proofs,
throttling.

A worker's first contact presents a one-time `cvy_join_` token and receives a credential secret `S`.
The database keeps only `stored_key = SHA-256(client_key)` and `server_key`, both derived from `S`
with HKDF, so a leaked row cannot authenticate: a proof needs `client_key`, the preimage of
`stored_key`. Proofs and the acceptor's signature are bound to the handshake's transcript hash, so a
relayed or replayed exchange fails.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import logging
import os
import secrets
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Literal

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from conveyor.cluster import store
from conveyor.cluster.channel import CLOSE_THROTTLED, CLOSE_UNAUTHORIZED
from conveyor.cluster.messages import AuthRequest
from conveyor.db.engine import Database
from conveyor.model.ids import format_rfc3339

log = logging.getLogger(__name__)

JOIN_TOKEN_PREFIX = "cvy_join_"
CREDENTIAL_FILE = "peer-credential.json"
SECRET_BYTES = 32
CREDENTIAL_TTL = timedelta(days=90)
ROTATE_WHEN_LEFT = timedelta(days=30)
JOIN_TOKEN_DEFAULT_TTL_MS = 3600 * 1000
JOIN_TOKEN_MIN_TTL_MS = 60 * 1000
JOIN_TOKEN_MAX_TTL_MS = 7 * 24 * 3600 * 1000
THROTTLE_FAILURES = 5
THROTTLE_WINDOW_S = 60.0
AUTH_TIMEOUT_S = 15.0

PeerRole = Literal["coordinator", "worker"]


# --- join tokens


def new_join_token() -> str:
    """`cvy_join_` + base64url(32 random bytes), shown once."""
    return JOIN_TOKEN_PREFIX + base64.urlsafe_b64encode(secrets.token_bytes(32)).decode("ascii").rstrip("=")


def hash_join_token(token: str) -> str:
    """SHA-256 hex of the token: the only form stored."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def join_token_ttl_problem(expires_in_ms: int) -> str | None:
    """Why a requested join-token lifetime is refused (None when it is within 1 min–7 d)."""
    if not JOIN_TOKEN_MIN_TTL_MS <= expires_in_ms <= JOIN_TOKEN_MAX_TTL_MS:
        return (
            f"expires_in_ms must be between {JOIN_TOKEN_MIN_TTL_MS} (1 minute) and "
            f"{JOIN_TOKEN_MAX_TTL_MS} (7 days), got {expires_in_ms}"
        )
    return None


# --- credentials and proofs


@dataclass(frozen=True)
class CredentialKeys:
    """What a secret `S` derives for one instance id."""

    client_key: bytes
    stored_key: bytes
    server_key: bytes


def _hkdf(secret: bytes, instance_id: str, info: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=instance_id.encode("utf-8"), info=info).derive(
        secret
    )


def credential_keys(secret: bytes, instance_id: str) -> CredentialKeys:
    """`client_key`, `stored_key = SHA-256(client_key)` and `server_key` of `S` for `instance_id`."""
    client_key = _hkdf(secret, instance_id, b"conveyor-peer client")
    return CredentialKeys(
        client_key=client_key,
        stored_key=hashlib.sha256(client_key).digest(),
        server_key=_hkdf(secret, instance_id, b"conveyor-peer server"),
    )


def _bound(th: bytes, instance_id: str) -> bytes:
    return th + instance_id.encode("utf-8")


def _xor(a: bytes, b: bytes) -> bytes:
    return bytes(x ^ y for x, y in zip(a, b, strict=True))


def make_proof(client_key: bytes, stored_key: bytes, th: bytes, instance_id: str) -> bytes:
    """`proof = client_key XOR HMAC-SHA256(stored_key, th ‖ instance_id)`."""
    return _xor(client_key, hmac.digest(stored_key, _bound(th, instance_id), "sha256"))


def verify_proof(proof: bytes, stored_key: bytes, th: bytes, instance_id: str) -> bool:
    """Recover `client_key` from the proof and check its hash is `stored_key` (constant time)."""
    if len(proof) != 32:
        return False
    recovered = _xor(proof, hmac.digest(stored_key, _bound(th, instance_id), "sha256"))
    return hmac.compare_digest(hashlib.sha256(recovered).digest(), stored_key)


def server_signature(server_key: bytes, th: bytes, instance_id: str) -> bytes:
    """`HMAC(server_key, th ‖ instance_id)`: proves the acceptor holds this cluster's verifier."""
    return hmac.digest(server_key, _bound(th, instance_id), "sha256")


def encode_bytes(raw: bytes) -> str:
    """base64url text without padding (secrets, proofs and signatures on the wire)."""
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def decode_bytes(text: str) -> bytes | None:
    """Inverse of `encode_bytes`; None when `text` is not base64url."""
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        return None


def rotation_due(expires_at: datetime | None, now: datetime) -> bool:
    """Whether a credential is close enough to its expiry (≤ 30 d left) to be rotated."""
    return expires_at is not None and expires_at - now <= ROTATE_WHEN_LEFT


# --- the credential file


@dataclass(frozen=True)
class SavedCredential:
    """`$CONVEYOR_HOME/peer-credential.json`."""

    instance_id: str
    secret: str
    expires_at: str
    # The secret a rotation replaced: kept until a proof with `secret` succeeds, in case the rotation's
    # row never committed (its coordinator lost the lease or died between the ack and the commit).
    previous_secret: str | None = None

    @property
    def secret_bytes(self) -> bytes:
        """The secret `S`."""
        raw = decode_bytes(self.secret)
        if raw is None:
            raise ValueError("the saved credential's secret is not base64url")
        return raw


def save_credential(home: Path, credential: SavedCredential) -> Path:
    """Write the credential atomically with mode 0600: temp file, fsync, rename, directory fsync."""
    home.mkdir(parents=True, exist_ok=True)
    path = home / CREDENTIAL_FILE
    temporary = home / f".{CREDENTIAL_FILE}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    body = json.dumps(
        {
            "instance_id": credential.instance_id,
            "secret": credential.secret,
            "expires_at": credential.expires_at,
            **({"previous_secret": credential.previous_secret} if credential.previous_secret else {}),
        }
    ).encode("utf-8")
    # Created 0600 from the start: the secret is never readable by others, not even briefly.
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, body)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, path)
    directory = os.open(home, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
    return path


def load_credential(home: Path, instance_id: str) -> SavedCredential | None:
    """The saved credential for `instance_id`, or None (missing, unreadable, or another instance's)."""
    path = home / CREDENTIAL_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("ignoring an unreadable peer credential file %s: %s", path, exc)
        return None
    if not isinstance(data, dict) or data.get("instance_id") != instance_id:
        return None
    try:
        previous = data.get("previous_secret")
        return SavedCredential(
            str(data["instance_id"]),
            str(data["secret"]),
            str(data["expires_at"]),
            str(previous) if previous else None,
        )
    except KeyError:
        return None


# --- throttling


@dataclass
class AuthThrottle:
    """5 failures in 60 s per key (a remote address, an instance id) → further attempts refused (4429)."""

    max_failures: int = THROTTLE_FAILURES
    window_s: float = THROTTLE_WINDOW_S
    clock: Callable[[], float] = time.monotonic
    _failures: dict[str, deque[float]] = field(default_factory=dict)

    def _recent(self, key: str) -> deque[float]:
        times = self._failures.setdefault(key, deque())
        cutoff = self.clock() - self.window_s
        while times and times[0] <= cutoff:
            times.popleft()
        if not times:
            del self._failures[key]
            return deque()
        return times

    def throttled(self, *keys: str | None) -> bool:
        """Whether any of `keys` (`addr:…`, `instance:…`) has used up its failures in the window."""
        return any(key is not None and len(self._recent(key)) >= self.max_failures for key in keys)

    def record_failure(self, *keys: str | None) -> None:
        """Count one failure against every key."""
        now = self.clock()
        for key in keys:
            if key is not None:
                self._recent(key)
                self._failures.setdefault(key, deque()).append(now)


# --- the acceptor's decision


@dataclass(frozen=True)
class AuthOutcome:
    """What the acceptor answers: accepted with a role, or a reason and a close code."""

    accepted: bool
    reason: str | None = None
    close_code: int | None = None
    role: PeerRole | None = None
    credential_id: str | None = None
    server_signature: str | None = None
    issued: SavedCredential | None = None
    # The credential row's expiry (proof path): the acceptor rotates credentials close to it.
    expires_at: datetime | None = None
    # A refusal of a peer whose proof was valid (its credential is revoked or expired): only such
    # failures count against the instance id, since anyone can send a bad proof under any id.
    proven: bool = False


def refused(reason: str, code: int = CLOSE_UNAUTHORIZED, *, proven: bool = False) -> AuthOutcome:
    """A refusal carrying `reason` in `peer.auth.response`, then close `code`."""
    return AuthOutcome(accepted=False, reason=reason, close_code=code, proven=proven)


class PeerAuthenticator:
    """Checks `peer.auth.request`s against the database (join tokens and credential rows)."""

    def __init__(
        self,
        db: Database,
        *,
        me: str,
        throttle: AuthThrottle | None = None,
        on_failure: Callable[[str], None] = lambda reason: None,
        rng: Callable[[int], bytes] = secrets.token_bytes,
    ) -> None:
        self.db = db
        self.me = me
        self.throttle = throttle or AuthThrottle()
        self._on_failure = on_failure
        self._rng = rng

    async def authenticate(self, request: AuthRequest, *, th: bytes, remote: str | None) -> AuthOutcome:
        """Decide one request; failures count against the address, and against the instance id only
        when the peer proved it holds the instance's secret.

        An instance id is no secret: counting bad proofs or tokens against it would let anyone lock a
        live peer out by sending five of them under its id.
        """
        address = f"addr:{remote}" if remote else None
        instance = f"instance:{request.instance_id}"
        if self.throttle.throttled(address, instance):
            self._on_failure("throttled")
            return refused("throttled", CLOSE_THROTTLED)
        if request.join_token is not None:
            outcome = await self._join(request.instance_id, request.join_token)
        else:
            outcome = await self._prove(request.instance_id, request.proof or "", th)
        if not outcome.accepted:
            self.throttle.record_failure(address, instance if outcome.proven else None)
            self._on_failure(outcome.reason or "unknown")
        return outcome

    async def _join(self, instance_id: str, token: str) -> AuthOutcome:
        token_hash = hash_join_token(token)
        secret = self._rng(SECRET_BYTES)
        keys = credential_keys(secret, instance_id)
        async with self.db.transaction() as conn:
            now = await store.database_now(conn)
            if await store.has_live_credential(conn, instance_id, now):
                # A token never replaces a live credential (an impostor under a live peer's id would
                # retire it and take its jobs); a fresh token is left unspent for the peer it was for.
                return refused(await store.join_token_refusal(conn, token_hash, now) or "instance_enrolled")
            consumed = await store.consume_join_token(conn, token_hash, instance_id, now)
            if consumed is None:
                return refused(await store.join_token_refusal(conn, token_hash, now) or "token_used")
            expires_at = now + CREDENTIAL_TTL
            credential_id = await store.replace_credential(
                conn,
                instance_id=instance_id,
                role=consumed.role,
                stored_key=keys.stored_key,
                server_key=keys.server_key,
                join_token_id=consumed.id,
                now=now,
                expires_at=expires_at,
                validated_by=self.me,
            )
        issued = SavedCredential(instance_id, encode_bytes(secret), format_rfc3339(expires_at))
        return AuthOutcome(accepted=True, role=consumed.role, credential_id=credential_id, issued=issued)

    async def _prove(self, instance_id: str, proof_text: str, th: bytes) -> AuthOutcome:
        proof = decode_bytes(proof_text)
        async with self.db.transaction() as conn:
            now = await store.database_now(conn)
            row = await store.latest_credential(conn, instance_id)
            if row is None:
                return refused("credential_unknown")
            # The proof first: only its holder learns that the credential is revoked or expired.
            if proof is None or not verify_proof(proof, row.stored_key, th, instance_id):
                return refused("proof_invalid")
            if row.revoked_at is not None:
                return refused("credential_revoked", proven=True)
            if row.expires_at <= now:
                return refused("credential_expired", proven=True)
            await store.touch_credential(conn, row.id, now, self.me)
        signature = encode_bytes(server_signature(row.server_key, th, instance_id))
        return AuthOutcome(
            accepted=True,
            role=row.role,
            credential_id=row.id,
            server_signature=signature,
            expires_at=row.expires_at,
        )


async def self_enrol(db: Database, home: Path, instance_id: str) -> SavedCredential:
    """A coordinator's own credential: the saved one when its row is still valid, else a new row.

    Anything with database access is trusted, so a coordinator needs no join token
    (docs/design/cluster.md §2.2).
    """
    saved = load_credential(home, instance_id)
    async with db.transaction() as conn:
        now = await store.database_now(conn)
        row = await store.latest_credential(conn, instance_id)
        if (
            saved is not None
            and row is not None
            and row.revoked_at is None
            and row.expires_at > now
            and credential_keys(saved.secret_bytes, instance_id).stored_key == row.stored_key
        ):
            return saved
        secret = secrets.token_bytes(SECRET_BYTES)
        keys = credential_keys(secret, instance_id)
        expires_at = now + CREDENTIAL_TTL
        credential = SavedCredential(instance_id, encode_bytes(secret), format_rfc3339(expires_at))
        # Saved before the row commits: a crash in between leaves a file whose row never existed,
        # which the next boot replaces, never a row whose secret is lost.
        save_credential(home, credential)
        await store.replace_credential(
            conn,
            instance_id=instance_id,
            role="coordinator",
            stored_key=keys.stored_key,
            server_key=keys.server_key,
            join_token_id=None,
            now=now,
            expires_at=expires_at,
            validated_by=instance_id,
        )
    return credential
