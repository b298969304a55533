"""Encryption at rest (docs/design/admin.md §6): master-key parsing, fingerprints, AES-256-GCM with row
identity.

Every encrypted value is stored as `nonce ‖ ciphertext ‖ tag` with a fresh random 12-byte nonce, and
authenticated together with the identity of the row it belongs to (its associated data). A
ciphertext copied into another row, or altered in place, fails authentication instead of
decrypting to the wrong value. The cipher itself is `cryptography`'s AESGCM; nothing here is
home-made crypto.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from conveyor.errors import ConveyorError

KEY_BYTES = 32
NONCE_BYTES = 12
TAG_BYTES = 16
FINGERPRINT_HEX_CHARS = 16
_FINGERPRINT_DOMAIN = b"conveyor-key-fp:"
_HEX_KEY = re.compile(r"^[0-9a-fA-F]{64}$")


class SecretCryptoError(ConveyorError):
    """Base of the errors this package raises about keys and ciphertexts."""


class InvalidMasterKey(SecretCryptoError):
    """A configured master key is not 64 hex characters nor base64 of 32 bytes."""


class SecretIntegrityError(SecretCryptoError):
    """A ciphertext failed authentication: it was altered or belongs to another row."""


@dataclass(frozen=True)
class MasterKey:
    """A 32-byte AES-256 key and its public fingerprint (the key never appears in a repr)."""

    material: bytes = field(repr=False)
    fingerprint: str

    @classmethod
    def of(cls, material: bytes) -> MasterKey:
        """Wrap raw key bytes, computing the fingerprint."""
        if len(material) != KEY_BYTES:
            raise InvalidMasterKey(f"a master key is {KEY_BYTES} bytes, not {len(material)}")
        return cls(material=material, fingerprint=key_fingerprint(material))

    @classmethod
    def generate(cls, random_bytes: Callable[[int], bytes] = os.urandom) -> MasterKey:
        """A new random key."""
        return cls.of(random_bytes(KEY_BYTES))

    def as_text(self) -> str:
        """The key as 64 hex characters, the form written to key files."""
        return self.material.hex()


def key_fingerprint(material: bytes) -> str:
    """First 16 hex of SHA-256("conveyor-key-fp:" ‖ key): safe to show, log and store."""
    return hashlib.sha256(_FINGERPRINT_DOMAIN + material).hexdigest()[:FINGERPRINT_HEX_CHARS]


def decode_key_bytes(text: str) -> bytes | None:
    """32 key bytes given as 64 hex characters or as base64 (standard or URL-safe) of them; None otherwise."""
    value = text.strip()
    if _HEX_KEY.match(value):
        return bytes.fromhex(value)
    try:
        decoded = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        decoded = b""
    if len(decoded) != KEY_BYTES:
        try:
            decoded = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
        except (binascii.Error, ValueError):
            decoded = b""
    return decoded if len(decoded) == KEY_BYTES and value else None


def parse_master_key(text: str, *, origin: str) -> MasterKey:
    """Read a key given as 64 hex characters or as base64 of 32 bytes; `origin` names it in errors."""
    decoded = decode_key_bytes(text)
    if decoded is not None:
        return MasterKey.of(decoded)
    # Never echo the value: it may be a real key with a typo.
    raise InvalidMasterKey(
        f"{origin} is not a valid master key: use 64 hex characters or base64 of 32 random bytes "
        f"(e.g. `openssl rand -hex 32`)"
    )


def secret_row_identity(org_id: str, scope: str, name: str) -> str:
    """Associated data of a row of `secrets`."""
    return f"secrets:{org_id}:{scope}:{name}"


def column_identity(table: str, row_id: str, column: str) -> str:
    """Associated data of an encrypted column of any other table (webhook secrets, provider keys)."""
    return f"{table}:{row_id}:{column}"


def encrypt_value(
    key: MasterKey,
    plaintext: bytes,
    identity: str,
    random_bytes: Callable[[int], bytes] = os.urandom,
) -> bytes:
    """AES-256-GCM under a fresh nonce, bound to `identity`; returns `nonce ‖ ciphertext ‖ tag`."""
    nonce = random_bytes(NONCE_BYTES)
    return nonce + AESGCM(key.material).encrypt(nonce, plaintext, identity.encode())


def decrypt_value(key: MasterKey, stored: bytes, identity: str) -> bytes:
    """Authenticate and decrypt `stored` for the row `identity`; `SecretIntegrityError` if it fails."""
    if len(stored) < NONCE_BYTES + TAG_BYTES:
        raise SecretIntegrityError(f"the ciphertext of {identity} is truncated")
    nonce, body = stored[:NONCE_BYTES], stored[NONCE_BYTES:]
    try:
        return AESGCM(key.material).decrypt(nonce, body, identity.encode())
    except InvalidTag:
        raise SecretIntegrityError(
            f"the ciphertext of {identity} failed authentication: it was altered or copied from "
            "another row; set the value again"
        ) from None
