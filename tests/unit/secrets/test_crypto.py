"""Key parsing, fingerprints and AES-256-GCM bound to the row identity (docs/design/admin.md §6)."""

import base64
import hashlib

import pytest

from conveyor.secrets.crypto import (
    InvalidMasterKey,
    MasterKey,
    SecretIntegrityError,
    column_identity,
    decrypt_value,
    encrypt_value,
    key_fingerprint,
    parse_master_key,
    secret_row_identity,
)

RAW = bytes(range(32))


def test_a_key_is_accepted_as_64_hex_characters_or_base64_of_32_bytes() -> None:
    assert parse_master_key(RAW.hex(), origin="X").material == RAW
    assert parse_master_key(RAW.hex().upper() + "\n", origin="X").material == RAW
    assert parse_master_key(base64.b64encode(RAW).decode(), origin="X").material == RAW
    assert parse_master_key(base64.urlsafe_b64encode(RAW).decode().rstrip("="), origin="X").material == RAW


@pytest.mark.parametrize(
    "bad", ["", "abc", "00" * 31, "00" * 33, "zz" * 32, base64.b64encode(b"x" * 31).decode()]
)
def test_a_malformed_key_is_refused_without_echoing_it(bad: str) -> None:
    with pytest.raises(InvalidMasterKey, match="CONVEYOR_SECRET_KEY is not a valid master key") as caught:
        parse_master_key(bad, origin="CONVEYOR_SECRET_KEY")
    if bad:
        assert bad not in str(caught.value)


def test_the_fingerprint_is_the_first_16_hex_of_a_domain_separated_sha256() -> None:
    expected = hashlib.sha256(b"conveyor-key-fp:" + RAW).hexdigest()[:16]
    assert key_fingerprint(RAW) == expected
    assert MasterKey.of(RAW).fingerprint == expected


def test_the_key_material_never_appears_in_a_repr() -> None:
    key = MasterKey.of(RAW)
    assert RAW.hex() not in repr(key) and str(RAW) not in repr(key)


def test_a_value_round_trips_and_is_stored_as_nonce_ciphertext_tag() -> None:
    key = MasterKey.of(RAW)
    identity = secret_row_identity("default", "org", "TOKEN")
    stored = encrypt_value(key, b"hunter2", identity)
    assert len(stored) == 12 + len(b"hunter2") + 16
    assert b"hunter2" not in stored
    assert decrypt_value(key, stored, identity) == b"hunter2"


def test_every_encryption_uses_a_fresh_nonce() -> None:
    key = MasterKey.of(RAW)
    identity = secret_row_identity("default", "org", "TOKEN")
    assert encrypt_value(key, b"same", identity) != encrypt_value(key, b"same", identity)


def test_a_ciphertext_moved_to_another_row_fails_authentication() -> None:
    key = MasterKey.of(RAW)
    stored = encrypt_value(key, b"value-of-a", secret_row_identity("default", "org", "A"))
    with pytest.raises(SecretIntegrityError, match="copied from another row"):
        decrypt_value(key, stored, secret_row_identity("default", "org", "B"))
    with pytest.raises(SecretIntegrityError):
        decrypt_value(key, stored, secret_row_identity("default", "env/prod", "A"))


def test_an_altered_or_truncated_ciphertext_fails_authentication() -> None:
    key = MasterKey.of(RAW)
    identity = column_identity("sources", "s1", "webhook_secret")
    stored = bytearray(encrypt_value(key, b"value", identity))
    stored[14] ^= 1
    with pytest.raises(SecretIntegrityError):
        decrypt_value(key, bytes(stored), identity)
    with pytest.raises(SecretIntegrityError, match="truncated"):
        decrypt_value(key, bytes(stored[:20]), identity)


def test_another_key_cannot_decrypt() -> None:
    identity = secret_row_identity("default", "org", "A")
    stored = encrypt_value(MasterKey.of(RAW), b"value", identity)
    with pytest.raises(SecretIntegrityError):
        decrypt_value(MasterKey.generate(), stored, identity)
