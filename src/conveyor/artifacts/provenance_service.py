"""Provenance of artifacts (docs/design/artifacts.md §9): minting a statement on first request, verifying an
artifact's stored bytes against it, and the retention of statements. The decisions are in `provenance.py`,
the SQL in `provenance_store.py`."""

from __future__ import annotations

import base64
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.artifacts import provenance_store, store
from conveyor.artifacts.provenance import (
    ArtifactFacts,
    EnvelopeInvalid,
    SigningKey,
    build_statement,
    sign_envelope,
    statement_problems,
    subject_digest,
    verify_envelope,
)
from conveyor.blobs import BlobCorrupt, BlobNotFound, BlobStore
from conveyor.db.engine import Database
from conveyor.model.errors import ApiError, not_found
from conveyor.model.ids import format_rfc3339, utc_now

# Retention deletes statements in batches of this many rows, each its own transaction.
BATCH = 500
# Event types whose payload's `inputs` are the run's parameters (a dispatch's, a schedule's).
_INPUT_EVENTS = frozenset({"dispatch", "schedule"})

ClusterKnob = Callable[[str], Awaitable[int]]


def provenance_expired(name: str, days: int) -> ApiError:
    """410 for an artifact whose provenance the retention removed (or would have)."""
    return ApiError(
        410,
        "provenance_expired",
        f"the provenance of artifact {name} is older than provenance_retention_days ({days}) and was removed",
    )


def facts_from_row(row: Mapping[str, Any]) -> ArtifactFacts:
    """A statement's facts from `provenance_store.statement_facts`' row."""
    event = row["event"] if isinstance(row["event"], Mapping) else {}
    event_type = event.get("type")
    inputs: Mapping[str, Any] = {}
    if event_type in _INPUT_EVENTS:
        inputs = (event.get("payload") or {}).get("inputs") or {}
    return ArtifactFacts(
        artifact_name=row["name"],
        sha256=row["blob_sha256"],
        run_id=row["run_id"],
        routing_key=row["routing_key"],
        repository=row["repo"],
        ref=row["ref"],
        commit=row["sha"],
        event_type=event_type,
        workflow=row["workflow"],
        job=row["display_name"] or "",
        matrix=row["matrix"],
        inputs=inputs,
        lock_sha256=row["lock_sha256"],
        started_on=row["started_at"],
        finished_on=row["finished_at"],
    )


@dataclass
class ProvenanceService:
    """What the provenance routes and the artifact retention use."""

    db: Database
    blob_store: BlobStore
    key: SigningKey
    # The orchestrator's builder id (`CONVEYOR_PUBLIC_URL`, else this instance's URN), read when minting.
    builder_id: Callable[[], str]
    version: str
    # A cluster knob's effective value (`provenance_retention_days`).
    knob: ClusterKnob
    clock: Callable[[], datetime] = utc_now

    async def record_key(self) -> None:
        """Record this node's public key, so statements it signs verify on every coordinator, now and later."""
        async with self.db.transaction() as conn:
            await provenance_store.record_key(
                conn, self.key.key_id, base64.b64encode(self.key.public_bytes).decode("ascii"), self.clock()
            )

    async def _retention(self) -> int:
        return int(await self.knob("provenance_retention_days") or 0)

    async def statement(
        self, run_id: str, name: str
    ) -> tuple[dict[str, Any], provenance_store.StoredStatement]:
        """The artifact's row and its statement, minted now when it has none (404; 410 past retention).

        Two first requests may both sign: each inserts with ON CONFLICT DO NOTHING, then both answer the row
        that was stored, so every caller sees one envelope.
        """
        async with self.db.read() as conn:
            artifact = await store.artifact_named(conn, run_id, name)
            if artifact is None:
                raise not_found(f"artifact {name} of run {run_id}")
            found = await provenance_store.statement_of(conn, artifact["id"])
        days = await self._retention()
        if days and artifact["created_at"] < self.clock() - timedelta(days=days):
            raise provenance_expired(name, days)
        if found is not None:
            return artifact, found
        async with self.db.read() as conn:
            row = await provenance_store.statement_facts(conn, artifact["id"])
        if row is None:  # the run went between the two reads
            raise not_found(f"artifact {name} of run {run_id}")
        statement = build_statement(facts_from_row(row), builder_id=self.builder_id(), version=self.version)
        envelope = json.dumps(sign_envelope(self.key, statement), sort_keys=True)
        async with self.db.transaction() as conn:
            await provenance_store.insert_statement(
                conn, artifact["id"], run_id, self.key.key_id, envelope, self.clock()
            )
            stored = await provenance_store.statement_of(conn, artifact["id"])
        assert stored is not None  # ours, or the concurrent mint's that won
        return artifact, stored

    async def verify(self, run_id: str, name: str) -> dict[str, Any]:
        """Check the artifact's stored bytes against its verified statement: `{verified, problems, …facts}`."""
        artifact, stored = await self.statement(run_id, name)
        async with self.db.read() as conn:
            keys = await provenance_store.public_keys(conn)
        problems: list[str] = []
        statement: dict[str, Any] = {}
        key_id = stored.key_id
        try:
            envelope = json.loads(stored.envelope)
        except ValueError:
            envelope = {}
            problems.append("the stored envelope is not JSON")
        if envelope:
            try:
                verified = verify_envelope(envelope, keys)
            except EnvelopeInvalid as exc:
                problems.append(f"the statement's signature does not verify: {exc}")
            else:
                key_id, statement = verified.key_id, verified.statement
                problems += statement_problems(
                    statement, name=artifact["name"], sha256=artifact["blob_sha256"], run_id=run_id
                )
        expected = subject_digest(statement) if statement else artifact["blob_sha256"]
        actual = await self._stored_digest(artifact["blob_sha256"])
        if actual is None:
            problems.append(f"the artifact's blob sha256:{artifact['blob_sha256']} is missing from the store")
        elif actual != expected:
            problems.append(
                f"the stored bytes hash to sha256:{actual}, the statement names sha256:{expected}"
            )
        predicate = statement.get("predicate") or {}
        definition = predicate.get("buildDefinition") or {}
        details = predicate.get("runDetails") or {}
        metadata = details.get("metadata") or {}
        return {
            "verified": not problems,
            "problems": problems,
            "key_id": key_id,
            "public_key": keys.get(key_id),
            "subject": (statement.get("subject") or [None])[0],
            "stored_sha256": actual,
            "builder_id": (details.get("builder") or {}).get("id"),
            "build_type": definition.get("buildType"),
            "invocation_id": metadata.get("invocationId"),
            "started_on": metadata.get("startedOn"),
            "finished_on": metadata.get("finishedOn"),
            "external_parameters": definition.get("externalParameters") or {},
            "resolved_dependencies": definition.get("resolvedDependencies") or [],
            "minted_at": format_rfc3339(stored.created_at),
            "envelope": envelope,
        }

    async def _stored_digest(self, sha256: str) -> str | None:
        """The SHA-256 of the blob's bytes as the store holds them (None: absent).

        A whole read of a blob is hashed by the store itself, which raises `BlobCorrupt` naming the digest
        it found when the bytes differ from their address; hashing them again here would double the work,
        on the event loop."""
        try:
            async for _ in self.blob_store.get(sha256):
                pass
        except BlobNotFound:
            return None
        except BlobCorrupt as exc:
            return exc.found
        return sha256

    async def sweep(
        self, fence: Callable[[AsyncConnection], Awaitable[None]] | None = None, now: datetime | None = None
    ) -> int:
        """Delete the statements of gone artifacts and, under `provenance_retention_days`, of old ones (each
        batch fenced like the artifact retention's, so a deposed leader's batch rolls back)."""
        moment = now or self.clock()
        days = await self._retention()
        before = moment - timedelta(days=days) if days else None
        deleted = 0
        while True:
            async with self.db.transaction() as conn:
                count = await provenance_store.delete_expired_statements(conn, before, BATCH)
                if fence is not None:
                    await fence(conn)
            deleted += count
            if count < BATCH:
                return deleted
