"""The pure parts of provenance (docs/design/artifacts.md §9): the statement, DSSE's pre-authentication
encoding, signing, verification and the signing key's forms."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from conveyor.artifacts.provenance import (
    BUILD_TYPE,
    PAYLOAD_TYPE,
    PREDICATE_TYPE,
    STATEMENT_TYPE,
    ArtifactFacts,
    EnvelopeInvalid,
    ProvenanceKeyError,
    SigningKey,
    build_statement,
    canonical_json,
    key_id_of,
    pae,
    parse_signing_key,
    sign_envelope,
    statement_problems,
    verify_envelope,
)

DIGEST = "ab" * 32
FACTS = ArtifactFacts(
    artifact_name="dist-3.11",
    sha256=DIGEST,
    run_id="run-1",
    routing_key="github:acme/app",
    repository="https://github.com/acme/app",
    ref="refs/heads/main",
    commit="c0ffee" * 6 + "c0ff",
    event_type="dispatch",
    workflow="ci",
    job="build (3.11)",
    matrix={"py": "3.11"},
    inputs={"target": "prod"},
    lock_sha256="cd" * 32,
    started_on=datetime(2026, 12, 7, 10, 0, 0, 123000, tzinfo=UTC),
    finished_on=datetime(2026, 12, 7, 10, 5, 0, tzinfo=UTC),
)


def keyring(*keys: SigningKey) -> dict[str, str]:
    return {key.key_id: base64.b64encode(key.public_bytes).decode() for key in keys}


def test_the_statement_is_an_in_toto_v1_statement_with_a_slsa_v1_predicate() -> None:
    statement = build_statement(FACTS, builder_id="https://ci.example.com", version="1.2.3")
    assert statement["_type"] == STATEMENT_TYPE
    assert statement["subject"] == [{"name": "dist-3.11", "digest": {"sha256": DIGEST}}]
    assert statement["predicateType"] == PREDICATE_TYPE
    definition = statement["predicate"]["buildDefinition"]
    assert definition["buildType"] == BUILD_TYPE
    assert definition["externalParameters"] == {
        "source": "github:acme/app",
        "repository": "https://github.com/acme/app",
        "ref": "refs/heads/main",
        "commit": FACTS.commit,
        "event": "dispatch",
        "workflow": "ci",
        "job": "build (3.11)",
        "matrix": {"py": "3.11"},
        "inputs": {"target": "prod"},
    }
    assert definition["resolvedDependencies"] == [
        {"uri": "https://github.com/acme/app", "digest": {"gitCommit": FACTS.commit}},
        {"name": "conveyor.lock", "digest": {"sha256": "cd" * 32}},
    ]
    details = statement["predicate"]["runDetails"]
    assert details["builder"] == {"id": "https://ci.example.com", "version": {"conveyor": "1.2.3"}}
    assert details["metadata"] == {
        "invocationId": "run-1",
        "startedOn": "2026-12-07T10:00:00.123Z",
        "finishedOn": "2026-12-07T10:05:00.000Z",
    }


def test_a_run_without_commit_lock_or_end_leaves_those_out() -> None:
    facts = ArtifactFacts(**{**FACTS.__dict__, "commit": None, "lock_sha256": None, "finished_on": None})
    statement = build_statement(facts, builder_id="urn:conveyor:instance:a", version="0")
    assert statement["predicate"]["buildDefinition"]["resolvedDependencies"] == []
    assert "finishedOn" not in statement["predicate"]["runDetails"]["metadata"]


def test_pae_is_dsse_v1s_pre_authentication_encoding() -> None:
    # The DSSE specification's own example.
    assert pae("http://example.com/HelloWorld", b"hello world") == (
        b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"
    )
    assert pae("t", b"") == b"DSSEv1 1 t 0 "
    # Lengths are bytes, not characters.
    assert pae("é", "ü".encode()) == b"DSSEv1 2 \xc3\xa9 2 \xc3\xbc"


def test_an_envelope_signs_the_canonical_statement_under_the_key_it_names() -> None:
    key = SigningKey.generate()
    statement = build_statement(FACTS, builder_id="b", version="v")
    envelope = sign_envelope(key, statement)
    assert envelope["payloadType"] == PAYLOAD_TYPE
    body = base64.b64decode(envelope["payload"])
    assert body == canonical_json(statement) and json.loads(body) == statement
    [signature] = envelope["signatures"]
    assert signature["keyid"] == key.key_id == key_id_of(key.public_bytes)
    # Anyone with the raw public key verifies it with a standard Ed25519 implementation.
    Ed25519PublicKey.from_public_bytes(key.public_bytes).verify(
        base64.b64decode(signature["sig"]), pae(PAYLOAD_TYPE, body)
    )
    verified = verify_envelope(envelope, keyring(key))
    assert verified.key_id == key.key_id and verified.statement == statement


def altered(envelope: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return {**envelope, **changes}


def test_verification_refuses_an_altered_payload_signature_type_or_an_unknown_key() -> None:
    key, other = SigningKey.generate(), SigningKey.generate()
    statement = build_statement(FACTS, builder_id="b", version="v")
    envelope = sign_envelope(key, statement)
    forged = {**statement, "subject": [{"name": "dist-3.11", "digest": {"sha256": "ef" * 32}}]}
    with pytest.raises(EnvelopeInvalid, match="does not verify"):
        verify_envelope(
            altered(envelope, payload=base64.b64encode(canonical_json(forged)).decode()), keyring(key)
        )
    bad_sig = base64.b64encode(b"\0" * 64).decode()
    with pytest.raises(EnvelopeInvalid, match="does not verify"):
        verify_envelope(altered(envelope, signatures=[{"keyid": key.key_id, "sig": bad_sig}]), keyring(key))
    with pytest.raises(EnvelopeInvalid, match="payloadType"):
        verify_envelope(altered(envelope, payloadType="application/json"), keyring(key))
    with pytest.raises(EnvelopeInvalid, match="not a recorded provenance key"):
        verify_envelope(envelope, keyring(other))
    # A signature by another key claiming this key's id fails too.
    stolen_id = sign_envelope(other, statement)["signatures"][0]["sig"]
    with pytest.raises(EnvelopeInvalid, match="does not verify"):
        verify_envelope(
            altered(envelope, signatures=[{"keyid": key.key_id, "sig": stolen_id}]), keyring(key, other)
        )
    with pytest.raises(EnvelopeInvalid, match="no signature"):
        verify_envelope(altered(envelope, signatures=[]), keyring(key))


def test_an_old_key_still_verifies_what_it_signed_beside_the_new_one() -> None:
    old, new = SigningKey.generate(), SigningKey.generate()
    statement = build_statement(FACTS, builder_id="b", version="v")
    keys = keyring(old, new)
    assert verify_envelope(sign_envelope(old, statement), keys).key_id == old.key_id
    assert verify_envelope(sign_envelope(new, statement), keys).key_id == new.key_id


def test_statement_problems_name_what_does_not_fit_the_artifact() -> None:
    statement = build_statement(FACTS, builder_id="b", version="v")
    assert statement_problems(statement, name="dist-3.11", sha256=DIGEST, run_id="run-1") == []
    problems = statement_problems(statement, name="other", sha256="00" * 32, run_id="run-2")
    assert any("subject is 'dist-3.11', not the artifact 'other'" in p for p in problems)
    assert any(f"sha256:{DIGEST}, the artifact's sha256:{'00' * 32}" in p for p in problems)
    assert any("invocationId is 'run-1', not the run run-2" in p for p in problems)
    wrong_type = {**statement, "_type": "https://in-toto.io/Statement/v0.1"}
    assert statement_problems(wrong_type, name="dist-3.11", sha256=DIGEST, run_id="run-1")


def test_a_signing_key_reads_as_pem_hex_or_base64_and_never_echoes_a_bad_one() -> None:
    key = SigningKey.generate()
    seed = key.private.private_bytes_raw()
    for text in (key.as_pem(), seed.hex(), base64.b64encode(seed).decode(), f"  {seed.hex()}\n"):
        assert parse_signing_key(text, origin="X").key_id == key.key_id
    with pytest.raises(ProvenanceKeyError, match="CONVEYOR_PROVENANCE_KEY is not a valid") as caught:
        parse_signing_key("deadbeef-secret", origin="CONVEYOR_PROVENANCE_KEY")
    assert "deadbeef" not in str(caught.value)
    with pytest.raises(ProvenanceKeyError, match="not an unencrypted Ed25519"):
        parse_signing_key("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----", origin="F")
    assert repr(key) == f"SigningKey(key_id={key.key_id!r})"
