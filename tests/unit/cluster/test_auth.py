"""Peer credentials (docs/design/cluster.md §2.2): the SCRAM-style verifier, proofs, the credential file,
throttling."""

import hashlib
import hmac
import json
import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path

from conveyor.cluster.auth import (
    JOIN_TOKEN_PREFIX,
    AuthThrottle,
    SavedCredential,
    credential_keys,
    decode_bytes,
    encode_bytes,
    hash_join_token,
    join_token_ttl_problem,
    load_credential,
    make_proof,
    new_join_token,
    rotation_due,
    save_credential,
    server_signature,
    verify_proof,
)

SECRET = bytes(range(32))
TH = hashlib.sha256(b"transcript").digest()


def test_join_tokens_are_prefixed_random_and_stored_as_sha256() -> None:
    token = new_join_token()
    assert token.startswith(JOIN_TOKEN_PREFIX)
    assert len(decode_bytes(token.removeprefix(JOIN_TOKEN_PREFIX)) or b"") == 32
    assert token != new_join_token()
    assert hash_join_token(token) == hashlib.sha256(token.encode()).hexdigest()


def test_join_token_lifetime_must_be_between_a_minute_and_seven_days() -> None:
    assert join_token_ttl_problem(60_000) is None
    assert join_token_ttl_problem(7 * 24 * 3600 * 1000) is None
    assert join_token_ttl_problem(59_999) is not None
    assert join_token_ttl_problem(7 * 24 * 3600 * 1000 + 1) is not None


def test_stored_key_is_the_hash_of_the_client_key_and_keys_depend_on_the_instance() -> None:
    keys = credential_keys(SECRET, "w1")
    assert keys.stored_key == hashlib.sha256(keys.client_key).digest()
    assert len({keys.client_key, keys.stored_key, keys.server_key}) == 3
    assert credential_keys(SECRET, "w2").stored_key != keys.stored_key


def test_the_real_secret_makes_a_proof_the_verifier_accepts() -> None:
    keys = credential_keys(SECRET, "w1")
    proof = make_proof(keys.client_key, keys.stored_key, TH, "w1")
    assert verify_proof(proof, keys.stored_key, TH, "w1")


def test_a_leaked_stored_key_or_server_key_cannot_make_a_proof() -> None:
    keys = credential_keys(SECRET, "w1")
    for leaked in (keys.stored_key, keys.server_key):
        assert not verify_proof(make_proof(leaked, keys.stored_key, TH, "w1"), keys.stored_key, TH, "w1")


def test_a_proof_is_bound_to_the_transcript_and_the_instance_id() -> None:
    keys = credential_keys(SECRET, "w1")
    proof = make_proof(keys.client_key, keys.stored_key, TH, "w1")
    other_th = hashlib.sha256(b"another session").digest()
    assert not verify_proof(proof, keys.stored_key, other_th, "w1")
    assert not verify_proof(proof, keys.stored_key, TH, "w2")
    assert not verify_proof(proof[:31], keys.stored_key, TH, "w1")


def test_the_server_signature_is_an_hmac_of_the_transcript_under_the_server_key() -> None:
    keys = credential_keys(SECRET, "w1")
    assert server_signature(keys.server_key, TH, "w1") == hmac.digest(keys.server_key, TH + b"w1", "sha256")
    assert server_signature(keys.stored_key, TH, "w1") != server_signature(keys.server_key, TH, "w1")


def test_the_credential_file_is_written_with_mode_0600_and_read_back(tmp_path: Path) -> None:
    saved = SavedCredential("w1", encode_bytes(SECRET), "2025-06-01T00:00:00.000Z")
    path = save_credential(tmp_path, saved)
    assert path == tmp_path / "peer-credential.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(path.read_text()) == {
        "instance_id": "w1",
        "secret": saved.secret,
        "expires_at": "2025-06-01T00:00:00.000Z",
    }
    assert load_credential(tmp_path, "w1") == saved
    assert load_credential(tmp_path, "w1").secret_bytes == SECRET  # type: ignore[union-attr]
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_a_credential_of_another_instance_or_a_broken_file_is_not_used(tmp_path: Path) -> None:
    save_credential(tmp_path, SavedCredential("w1", encode_bytes(SECRET), "x"))
    assert load_credential(tmp_path, "w2") is None
    (tmp_path / "peer-credential.json").write_text("{broken")
    assert load_credential(tmp_path, "w1") is None
    assert load_credential(tmp_path / "missing", "w1") is None


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_five_failures_in_a_minute_throttle_the_address_and_the_instance() -> None:
    clock = Clock()
    throttle = AuthThrottle(clock=clock)
    for _ in range(4):
        throttle.record_failure("addr:1.2.3.4", "instance:w1")
    assert not throttle.throttled("addr:1.2.3.4", "instance:w1")
    throttle.record_failure("addr:1.2.3.4", "instance:w1")
    assert throttle.throttled("addr:1.2.3.4", None)
    assert throttle.throttled("addr:5.6.7.8", "instance:w1")
    assert not throttle.throttled("addr:5.6.7.8", "instance:w2")


def test_throttling_ends_when_the_failures_leave_the_window() -> None:
    clock = Clock()
    throttle = AuthThrottle(clock=clock)
    for _ in range(5):
        throttle.record_failure("addr:a")
    clock.now += 59.9
    assert throttle.throttled("addr:a")
    clock.now += 0.2
    assert not throttle.throttled("addr:a")


def test_a_credential_is_rotated_when_thirty_days_or_less_are_left() -> None:
    now = datetime(2025, 3, 1, tzinfo=UTC)
    assert rotation_due(now + timedelta(days=30), now)
    assert not rotation_due(now + timedelta(days=30, seconds=1), now)
    assert not rotation_due(None, now)


def test_the_previous_secret_is_kept_in_the_file_after_a_rotation(tmp_path: Path) -> None:
    saved = SavedCredential("w1", "new", "2025-06-01T00:00:00.000Z", previous_secret="old")
    save_credential(tmp_path, saved)
    assert load_credential(tmp_path, "w1") == saved
    save_credential(tmp_path, SavedCredential("w1", "new", "x"))
    assert "previous_secret" not in json.loads((tmp_path / "peer-credential.json").read_text())
