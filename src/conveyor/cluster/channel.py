"""The `/ws/peer` channel's framing and crypto (docs/design/cluster.md §2.1), as pure functions and classes.

The acceptor sends a plaintext `peer.hello`, the dialer answers `peer.hello.response`; both derive
per-direction AES-256-GCM keys from an X25519 exchange (HKDF-SHA256, salt `nonce_s‖nonce_c`) and a
transcript hash `th` that reconnect proofs are bound to. Every later message is one binary frame,
`seq` (8 bytes big-endian) ‖ AES-256-GCM(ciphertext‖tag), and a receiver accepts only `seq = last+1`:
a replayed, reordered, skipped, forged or undecodable frame raises `ProtocolViolation`, which the
socket layer turns into close 4400 before anything in the frame is applied.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from conveyor.errors import ConveyorError

PROTOCOL_VERSION = 1
PROTOCOL_LABEL = b"conveyor-peer-v1"
INFO_C2S = b"conveyor-peer-v1 c2s"
INFO_S2C = b"conveyor-peer-v1 s2c"
# The AAD names the direction too, so a frame reflected back at its sender never decrypts even if
# both directions' keys were ever equal.
Direction = Literal["c2s", "s2c"]
DIRECTION_LABELS: dict[Direction, bytes] = {"c2s": INFO_C2S, "s2c": INFO_S2C}

KEY_BYTES = 32
NONCE_BYTES = 32
PUBLIC_KEY_BYTES = 32
SEQ_BYTES = 8
TAG_BYTES = 16
MAX_SEQ = 2**64 - 1

# Close codes (docs/design/cluster.md §2.2).
CLOSE_NORMAL = 1000
CLOSE_PROTOCOL = 4400
CLOSE_UNAUTHORIZED = 4401
CLOSE_REVOKED = 4403
CLOSE_AUTH_TIMEOUT = 4408
CLOSE_REPLACED = 4409
CLOSE_LEAVING = 4410
CLOSE_THROTTLED = 4429


class ProtocolViolation(ConveyorError):
    """The peer broke the channel's rules; the socket closes with 4400 and nothing is applied."""


def b64encode(raw: bytes) -> str:
    """Standard base64 text of `raw` (the hello messages' encoding)."""
    return base64.b64encode(raw).decode("ascii")


def b64decode(text: object, *, length: int, what: str) -> bytes:
    """Decode base64 `text` that must hold exactly `length` bytes; `ProtocolViolation` otherwise."""
    if not isinstance(text, str):
        raise ProtocolViolation(f"{what} must be base64 text")
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise ProtocolViolation(f"{what} is not valid base64") from exc
    if len(raw) != length:
        raise ProtocolViolation(f"{what} must be {length} bytes, got {len(raw)}")
    return raw


@dataclass(frozen=True)
class SessionKeys:
    """The two directions' AES-256 keys and the transcript hash of one handshake."""

    k_c2s: bytes
    k_s2c: bytes
    th: bytes


def _hkdf(ikm: bytes, salt: bytes, info: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=salt, info=info).derive(ikm)


def transcript_hash(pub_s: bytes, pub_c: bytes, nonce_s: bytes, nonce_c: bytes) -> bytes:
    """`th = SHA-256("conveyor-peer-v1" ‖ pub_s ‖ pub_c ‖ nonce_s ‖ nonce_c)`."""
    return hashlib.sha256(PROTOCOL_LABEL + pub_s + pub_c + nonce_s + nonce_c).digest()


def derive_session_keys(
    private: X25519PrivateKey,
    peer_public: bytes,
    *,
    pub_s: bytes,
    pub_c: bytes,
    nonce_s: bytes,
    nonce_c: bytes,
) -> SessionKeys:
    """Both directions' keys from `z = X25519(own, peer)`, and `th`; the two ends get equal results."""
    try:
        shared = private.exchange(X25519PublicKey.from_public_bytes(peer_public))
    except ValueError as exc:  # an all-zero (low-order) point gives no shared secret
        raise ProtocolViolation("the peer's ephemeral key is not usable") from exc
    salt = nonce_s + nonce_c
    return SessionKeys(
        k_c2s=_hkdf(shared, salt, INFO_C2S),
        k_s2c=_hkdf(shared, salt, INFO_S2C),
        th=transcript_hash(pub_s, pub_c, nonce_s, nonce_c),
    )


def public_bytes(private: X25519PrivateKey) -> bytes:
    """The raw 32-byte public key of `private`."""
    return private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def _gcm_nonce(seq: int) -> bytes:
    # 4 zero bytes ‖ seq: unique per key because seq never repeats within a direction.
    return b"\x00" * 4 + seq.to_bytes(SEQ_BYTES, "big")


def _aad(direction: Direction, seq: int) -> bytes:
    return DIRECTION_LABELS[direction] + seq.to_bytes(SEQ_BYTES, "big")


class FrameSealer:
    """Seals the messages one end sends in one direction: seq 1, 2, 3, … each exactly once."""

    def __init__(self, key: bytes, direction: Direction) -> None:
        self._aead = AESGCM(key)
        self._direction: Direction = direction
        self.last_seq = 0

    def seal(self, message: dict[str, Any]) -> bytes:
        """One binary frame carrying `message` as UTF-8 JSON."""
        if self.last_seq >= MAX_SEQ:
            raise ProtocolViolation("sequence numbers exhausted; reconnect")
        seq = self.last_seq + 1
        plaintext = json.dumps(message, separators=(",", ":")).encode("utf-8")
        sealed = self._aead.encrypt(_gcm_nonce(seq), plaintext, _aad(self._direction, seq))
        self.last_seq = seq
        return seq.to_bytes(SEQ_BYTES, "big") + sealed


class FrameOpener:
    """Opens the frames one end receives in one direction, accepting only `seq = last + 1`."""

    def __init__(self, key: bytes, direction: Direction) -> None:
        self._aead = AESGCM(key)
        self._direction: Direction = direction
        self.last_seq = 0

    def open(self, frame: bytes) -> dict[str, Any]:
        """The JSON object in `frame`; `ProtocolViolation` (state unchanged) for anything else."""
        if len(frame) < SEQ_BYTES + TAG_BYTES:
            raise ProtocolViolation(f"a frame of {len(frame)} bytes is too short")
        seq = int.from_bytes(frame[:SEQ_BYTES], "big")
        expected = self.last_seq + 1
        if seq != expected:
            kind = "a repeated or reordered" if seq <= self.last_seq else "a skipped"
            raise ProtocolViolation(f"{kind} sequence number: got {seq}, expected {expected}")
        try:
            plaintext = self._aead.decrypt(_gcm_nonce(seq), frame[SEQ_BYTES:], _aad(self._direction, seq))
        except InvalidTag as exc:
            raise ProtocolViolation(f"frame {seq} failed authentication") from exc
        try:
            message = json.loads(plaintext.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise ProtocolViolation(f"frame {seq} does not hold valid JSON") from exc
        if not isinstance(message, dict):
            raise ProtocolViolation(f"frame {seq} holds JSON that is not an object")
        # Advanced only now: a rejected frame leaves the opener as it was (the socket closes anyway).
        self.last_seq = seq
        return message


@dataclass
class SecureSession:
    """One end's sealer and opener after the handshake, and the transcript hash proofs bind to."""

    sealer: FrameSealer
    opener: FrameOpener
    th: bytes


def _session(keys: SessionKeys, *, acceptor: bool) -> SecureSession:
    if acceptor:
        return SecureSession(FrameSealer(keys.k_s2c, "s2c"), FrameOpener(keys.k_c2s, "c2s"), keys.th)
    return SecureSession(FrameSealer(keys.k_c2s, "c2s"), FrameOpener(keys.k_s2c, "s2c"), keys.th)


def _check_version(message: dict[str, Any], expected_type: str) -> None:
    if not isinstance(message, dict) or message.get("type") != expected_type:
        raise ProtocolViolation(f"expected {expected_type}")
    if message.get("protocol_version") != PROTOCOL_VERSION:
        raise ProtocolViolation(
            f"unsupported protocol_version {message.get('protocol_version')!r}; this node speaks {PROTOCOL_VERSION}"
        )


RandomBytes = Callable[[int], bytes]


class AcceptorHandshake:
    """The acceptor's side: `hello()` to send, then `complete(response)` gives the session."""

    def __init__(self, *, private: X25519PrivateKey | None = None, rng: RandomBytes = os.urandom) -> None:
        self._private = private or X25519PrivateKey.generate()
        self._pub = public_bytes(self._private)
        self._nonce_s = rng(NONCE_BYTES)

    def hello(self) -> dict[str, Any]:
        """The plaintext `peer.hello`."""
        return {
            "type": "peer.hello",
            "protocol_version": PROTOCOL_VERSION,
            "ephemeral_pub": b64encode(self._pub),
            "nonce_s": b64encode(self._nonce_s),
        }

    def complete(self, response: dict[str, Any]) -> SecureSession:
        """The session from the dialer's `peer.hello.response`; `ProtocolViolation` if unusable."""
        _check_version(response, "peer.hello.response")
        pub_c = b64decode(response.get("ephemeral_pub"), length=PUBLIC_KEY_BYTES, what="ephemeral_pub")
        nonce_c = b64decode(response.get("nonce_c"), length=NONCE_BYTES, what="nonce_c")
        keys = derive_session_keys(
            self._private, pub_c, pub_s=self._pub, pub_c=pub_c, nonce_s=self._nonce_s, nonce_c=nonce_c
        )
        return _session(keys, acceptor=True)


def dialer_handshake(
    hello: dict[str, Any], *, private: X25519PrivateKey | None = None, rng: RandomBytes = os.urandom
) -> tuple[dict[str, Any], SecureSession]:
    """The dialer's side: from the acceptor's `peer.hello`, the response to send and the session."""
    _check_version(hello, "peer.hello")
    pub_s = b64decode(hello.get("ephemeral_pub"), length=PUBLIC_KEY_BYTES, what="ephemeral_pub")
    nonce_s = b64decode(hello.get("nonce_s"), length=NONCE_BYTES, what="nonce_s")
    own = private or X25519PrivateKey.generate()
    pub_c = public_bytes(own)
    nonce_c = rng(NONCE_BYTES)
    keys = derive_session_keys(own, pub_s, pub_s=pub_s, pub_c=pub_c, nonce_s=nonce_s, nonce_c=nonce_c)
    response = {
        "type": "peer.hello.response",
        "protocol_version": PROTOCOL_VERSION,
        "ephemeral_pub": b64encode(pub_c),
        "nonce_c": b64encode(nonce_c),
    }
    return response, _session(keys, acceptor=False)


def parse_plaintext(text: str | bytes) -> dict[str, Any]:
    """A plaintext hello message as a JSON object; `ProtocolViolation` otherwise."""
    try:
        message = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ProtocolViolation("the hello is not valid JSON") from exc
    if not isinstance(message, dict):
        raise ProtocolViolation("the hello is not a JSON object")
    return message
