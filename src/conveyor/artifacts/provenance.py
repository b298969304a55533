"""Provenance of artifacts (docs/design/artifacts.md §9): the in-toto statement with its SLSA v1 predicate,
the DSSE envelope that signs it, the Ed25519 signing key, and the checks a verification makes.

Everything here is pure: no database, no blob store, no files (`provenance_service.py` does the I/O). The
signature is `cryptography`'s Ed25519; nothing here is home-made crypto.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from conveyor.errors import ConveyorError
from conveyor.secrets.crypto import decode_key_bytes

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
BUILD_TYPE = "urn:conveyor:build-type:job:v1"
LOCK_FILE_NAME = "conveyor.lock"
KEY_ID_HEX_CHARS = 16


class ProvenanceKeyError(ConveyorError):
    """A configured signing key cannot be read; the message names where it came from."""


class EnvelopeInvalid(ConveyorError):
    """A DSSE envelope is malformed or its signature does not verify."""


# -- the signing key ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SigningKey:
    """An Ed25519 private key and its public key id (the key never appears in a repr)."""

    private: Ed25519PrivateKey = field(repr=False)
    key_id: str

    @classmethod
    def of(cls, private: Ed25519PrivateKey) -> SigningKey:
        """Wrap a private key, computing its key id."""
        return cls(private=private, key_id=key_id_of(public_key_bytes(private.public_key())))

    @classmethod
    def generate(cls) -> SigningKey:
        """A new random key."""
        return cls.of(Ed25519PrivateKey.generate())

    @property
    def public_bytes(self) -> bytes:
        """The raw 32-byte public key."""
        return public_key_bytes(self.private.public_key())

    def as_pem(self) -> str:
        """The private key as PKCS#8 PEM, the form written to key files."""
        return self.private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ).decode("ascii")

    def sign(self, message: bytes) -> bytes:
        """An Ed25519 signature of `message`."""
        return self.private.sign(message)


def public_key_bytes(public: Ed25519PublicKey) -> bytes:
    """The raw 32 bytes of a public key."""
    return public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def key_id_of(public_raw: bytes) -> str:
    """First 16 hex of SHA-256 of the raw public key: what a statement's signature names."""
    return hashlib.sha256(public_raw).hexdigest()[:KEY_ID_HEX_CHARS]


def parse_signing_key(text: str, *, origin: str) -> SigningKey:
    """A key given as PKCS#8 PEM, 64 hex characters of its seed, or base64 of the seed."""
    value = text.strip()
    if value.startswith("-----BEGIN"):
        try:
            loaded = serialization.load_pem_private_key(value.encode("ascii"), password=None)
        except (ValueError, TypeError, UnicodeEncodeError):
            loaded = None
        if isinstance(loaded, Ed25519PrivateKey):
            return SigningKey.of(loaded)
        raise ProvenanceKeyError(f"{origin} is not an unencrypted Ed25519 private key in PEM")
    seed = decode_key_bytes(value)  # a master key's forms: the seed is 32 bytes too
    if seed is None:
        # Never echo the value: it may be a real key with a typo.
        raise ProvenanceKeyError(
            f"{origin} is not a valid Ed25519 signing key: use a PKCS#8 PEM (`openssl genpkey -algorithm "
            "ed25519`), 64 hex characters or base64 of a 32-byte seed"
        )
    return SigningKey.of(Ed25519PrivateKey.from_private_bytes(seed))


def load_public_key(encoded: str) -> Ed25519PublicKey:
    """A public key stored as base64 of its raw 32 bytes."""
    try:
        return Ed25519PublicKey.from_public_bytes(base64.b64decode(encoded, validate=True))
    except (binascii.Error, ValueError) as exc:
        raise EnvelopeInvalid(f"the recorded public key is malformed: {exc}") from None


# -- the statement ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ArtifactFacts:
    """What a statement says about one artifact, read from its run's and job's rows."""

    artifact_name: str
    sha256: str
    run_id: str
    routing_key: str | None
    repository: str
    ref: str | None
    commit: str | None
    event_type: str | None
    workflow: str
    job: str
    matrix: Mapping[str, Any] | None
    inputs: Mapping[str, Any]
    lock_sha256: str | None
    started_on: datetime | None
    finished_on: datetime | None


def rfc3339(moment: datetime) -> str:
    """A UTC time as RFC 3339 with a `Z` (the form SLSA's timestamps use)."""
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def build_statement(facts: ArtifactFacts, *, builder_id: str, version: str) -> dict[str, Any]:
    """The in-toto Statement v1 with a SLSA Provenance v1 predicate for one artifact."""
    external: dict[str, Any] = {
        "source": facts.routing_key,
        "repository": facts.repository,
        "ref": facts.ref,
        "commit": facts.commit,
        "event": facts.event_type,
        "workflow": facts.workflow,
        "job": facts.job,
        "inputs": dict(facts.inputs),
    }
    if facts.matrix:
        external["matrix"] = dict(facts.matrix)
    dependencies: list[dict[str, Any]] = []
    if facts.commit:
        dependencies.append({"uri": facts.repository, "digest": {"gitCommit": facts.commit}})
    if facts.lock_sha256:
        dependencies.append({"name": LOCK_FILE_NAME, "digest": {"sha256": facts.lock_sha256}})
    metadata: dict[str, Any] = {"invocationId": facts.run_id}
    if facts.started_on is not None:
        metadata["startedOn"] = rfc3339(facts.started_on)
    if facts.finished_on is not None:
        metadata["finishedOn"] = rfc3339(facts.finished_on)
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": facts.artifact_name, "digest": {"sha256": facts.sha256}}],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": external,
                "resolvedDependencies": dependencies,
            },
            "runDetails": {
                "builder": {"id": builder_id, "version": {"conveyor": version}},
                "metadata": metadata,
            },
        },
    }


def canonical_json(document: Mapping[str, Any]) -> bytes:
    """The statement's bytes: keys sorted, no spaces, UTF-8."""
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


# -- DSSE ---------------------------------------------------------------------------------------------


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE v1 pre-authentication encoding: `DSSEv1 SP len(type) SP type SP len(body) SP body`."""
    kind = payload_type.encode("utf-8")
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


def sign_envelope(key: SigningKey, statement: Mapping[str, Any]) -> dict[str, Any]:
    """The DSSE envelope of `statement`, signed by `key` and naming its key id."""
    body = canonical_json(statement)
    signature = key.sign(pae(PAYLOAD_TYPE, body))
    return {
        "payloadType": PAYLOAD_TYPE,
        "payload": base64.b64encode(body).decode("ascii"),
        "signatures": [{"keyid": key.key_id, "sig": base64.b64encode(signature).decode("ascii")}],
    }


@dataclass(frozen=True)
class VerifiedEnvelope:
    """An envelope whose signature verified: the key that signed it and the statement it carries."""

    key_id: str
    statement: dict[str, Any]


def verify_envelope(envelope: Mapping[str, Any], public_keys: Mapping[str, str]) -> VerifiedEnvelope:
    """Check `envelope`'s signature under the recorded key it names (`public_keys`: key id → base64).

    `EnvelopeInvalid` says what failed: the shape, the payload type, an unknown key id, the signature, or a
    payload that is not a JSON object.
    """
    payload_type = envelope.get("payloadType")
    if payload_type != PAYLOAD_TYPE:
        raise EnvelopeInvalid(f"the envelope's payloadType is {payload_type!r}, not {PAYLOAD_TYPE!r}")
    try:
        body = base64.b64decode(str(envelope.get("payload", "")), validate=True)
    except (binascii.Error, ValueError):
        raise EnvelopeInvalid("the envelope's payload is not base64") from None
    signatures = envelope.get("signatures")
    if not isinstance(signatures, list) or not signatures:
        raise EnvelopeInvalid("the envelope carries no signature")
    failures: list[str] = []
    for signature in signatures:
        if not isinstance(signature, Mapping):
            failures.append("a signature entry is not an object")
            continue
        key_id = str(signature.get("keyid", ""))
        encoded = public_keys.get(key_id)
        if encoded is None:
            failures.append(f"key id {key_id!r} is not a recorded provenance key")
            continue
        try:
            raw_signature = base64.b64decode(str(signature.get("sig", "")), validate=True)
            load_public_key(encoded).verify(raw_signature, pae(str(payload_type), body))
        except (binascii.Error, ValueError, InvalidSignature):
            failures.append(f"the signature under key {key_id} does not verify")
            continue
        try:
            statement = json.loads(body)
        except ValueError:
            raise EnvelopeInvalid("the signed payload is not JSON") from None
        if not isinstance(statement, dict):
            raise EnvelopeInvalid("the signed payload is not a JSON object")
        return VerifiedEnvelope(key_id, statement)
    raise EnvelopeInvalid("; ".join(failures))


def statement_problems(statement: Mapping[str, Any], *, name: str, sha256: str, run_id: str) -> list[str]:
    """What a verified statement says that does not fit the artifact it is meant for (empty: it fits)."""
    problems: list[str] = []
    if statement.get("_type") != STATEMENT_TYPE:
        problems.append(f"the statement's _type is {statement.get('_type')!r}, not {STATEMENT_TYPE!r}")
    if statement.get("predicateType") != PREDICATE_TYPE:
        problems.append(
            f"the statement's predicateType is {statement.get('predicateType')!r}, not {PREDICATE_TYPE!r}"
        )
    subjects = statement.get("subject")
    subject = subjects[0] if isinstance(subjects, list) and len(subjects) == 1 else None
    if not isinstance(subject, Mapping):
        problems.append("the statement does not name exactly one subject")
    else:
        if subject.get("name") != name:
            problems.append(f"the statement's subject is {subject.get('name')!r}, not the artifact {name!r}")
        digest = (subject.get("digest") or {}).get("sha256")
        if digest != sha256:
            problems.append(
                f"the statement's subject digest is sha256:{digest}, the artifact's sha256:{sha256}"
            )
    invocation = (((statement.get("predicate") or {}).get("runDetails") or {}).get("metadata") or {}).get(
        "invocationId"
    )
    if invocation != run_id:
        problems.append(f"the statement's invocationId is {invocation!r}, not the run {run_id}")
    return problems


def subject_digest(statement: Mapping[str, Any]) -> str | None:
    """The sha256 the statement's (first) subject names."""
    subjects = statement.get("subject")
    if isinstance(subjects, list) and subjects and isinstance(subjects[0], Mapping):
        found = (subjects[0].get("digest") or {}).get("sha256")
        return str(found) if found is not None else None
    return None
