"""Provenance of artifacts (docs/design/artifacts.md §9) against the artifact upload API, on SQLite and
PostgreSQL: a statement minted on first request and signed, verification of the stored bytes against it,
the failures a changed blob or an altered statement cause, key rotation, concurrent minting and retention."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select, update

from conveyor.artifacts.provenance import SigningKey, canonical_json
from conveyor.artifacts.routes import PROVENANCE
from conveyor.artifacts.startup import GENERATED_PROVENANCE_KEY
from conveyor.db.tables import jobs, provenance_keys, provenance_statements, runs
from conveyor.model.ids import utc_now
from tests.integration.artifacts.conftest import ENV, Job, job_with_token, publish, service_of
from tests.support.inprocess import InProcessServer, in_process_server

COMMIT = "1234567890abcdef1234567890abcdef12345678"
LOCK = "cd" * 32


async def dispatched_job(server: InProcessServer) -> Job:
    """A job holding a credential, its run made by a dispatch at a commit (so every fact is filled in)."""
    job = await job_with_token(server)
    async with server.state.db.transaction() as conn:
        await conn.execute(
            update(runs)
            .where(runs.c.id == job.run_id)
            .values(
                sha=COMMIT,
                ref="refs/heads/main",
                lock_sha256=LOCK,
                event={"type": "dispatch", "payload": {"inputs": {"target": "staging"}}},
            )
        )
        await conn.execute(update(jobs).where(jobs.c.id == job.job_id).values(started_at=utc_now()))
    return job


def provenance_path(job: Job, name: str) -> str:
    return f"/api/v1/admin/runs/{job.run_id}/artifacts/{name}/provenance"


async def verify(server: InProcessServer, job: Job, name: str) -> dict[str, Any]:
    answer = await server.client.get(provenance_path(job, name) + "/verify", headers=server.auth())
    assert answer.status_code == 200, answer.text
    assert answer.headers["cache-control"] == "no-store"
    body: dict[str, Any] = answer.json()
    return body


def blob_path(server: InProcessServer, sha256: str) -> Path:
    return server.state.settings.home / "blobs" / "sha256" / sha256[:2] / sha256


async def test_verify_succeeds_for_an_uploaded_artifact_and_names_its_key_facts(
    server: InProcessServer,
) -> None:
    job = await dispatched_job(server)
    data = b"release bytes " * 1000
    artifact = await publish(server.client, job, "dist", data)

    served = await server.client.get(provenance_path(job, "dist"), headers=server.auth())
    assert served.status_code == 200, served.text
    envelope = served.json()
    assert envelope["payloadType"] == "application/vnd.in-toto+json"
    statement = json.loads(base64.b64decode(envelope["payload"]))
    assert statement["subject"] == [{"name": "dist", "digest": {"sha256": hashlib.sha256(data).hexdigest()}}]
    external = statement["predicate"]["buildDefinition"]["externalParameters"]
    assert external["source"] == "local:app" and external["commit"] == COMMIT
    assert external["workflow"] == "ci" and external["job"] == "build"
    assert external["inputs"] == {"target": "staging"}
    assert {"name": "conveyor.lock", "digest": {"sha256": LOCK}} in statement["predicate"]["buildDefinition"][
        "resolvedDependencies"
    ]
    metadata = statement["predicate"]["runDetails"]["metadata"]
    assert metadata["invocationId"] == job.run_id and "startedOn" in metadata

    key = server.state.parts.need(PROVENANCE).key
    assert served.headers["x-conveyor-key-id"] == key.key_id == envelope["signatures"][0]["keyid"]

    checked = await verify(server, job, "dist")
    assert checked["verified"] is True, checked["problems"]
    assert checked["problems"] == []
    assert checked["key_id"] == key.key_id
    assert checked["stored_sha256"] == artifact["sha256"]
    assert checked["invocation_id"] == job.run_id
    assert checked["envelope"] == envelope, "verify checks the statement the route serves"
    assert checked["public_key"] == base64.b64encode(key.public_bytes).decode()

    missing = await server.client.get(provenance_path(job, "nope"), headers=server.auth())
    assert missing.status_code == 404


async def test_verify_fails_after_the_artifacts_bytes_change_on_the_store(server: InProcessServer) -> None:
    job = await dispatched_job(server)
    artifact = await publish(server.client, job, "dist", b"the bytes the job made" * 100)
    assert (await verify(server, job, "dist"))["verified"] is True

    blob = blob_path(server, artifact["sha256"])
    blob.chmod(0o644)
    blob.write_bytes(b"the bytes an intruder put" * 100)

    checked = await verify(server, job, "dist")
    assert checked["verified"] is False
    tampered = hashlib.sha256(b"the bytes an intruder put" * 100).hexdigest()
    assert checked["problems"] == [
        f"the stored bytes hash to sha256:{tampered}, the statement names sha256:{artifact['sha256']}"
    ]


async def alter_envelope(server: InProcessServer, artifact_id: str, change: Any) -> None:
    async with server.state.db.transaction() as conn:
        stored = (
            await conn.execute(
                select(provenance_statements.c.envelope).where(
                    provenance_statements.c.artifact_id == artifact_id
                )
            )
        ).scalar_one()
        envelope = change(json.loads(stored))
        await conn.execute(
            update(provenance_statements)
            .where(provenance_statements.c.artifact_id == artifact_id)
            .values(envelope=json.dumps(envelope))
        )


async def test_verify_fails_after_the_statement_is_altered(server: InProcessServer) -> None:
    job = await dispatched_job(server)
    artifact = await publish(server.client, job, "dist", b"genuine")
    other = await publish(server.client, job, "other", b"something else")
    assert (await verify(server, job, "dist"))["verified"] is True

    # The payload rewritten to claim another commit: its signature no longer covers it.
    def other_commit(envelope: dict[str, Any]) -> dict[str, Any]:
        statement = json.loads(base64.b64decode(envelope["payload"]))
        statement["predicate"]["buildDefinition"]["externalParameters"]["commit"] = "f" * 40
        return {**envelope, "payload": base64.b64encode(canonical_json(statement)).decode()}

    await alter_envelope(server, artifact["id"], other_commit)
    checked = await verify(server, job, "dist")
    assert checked["verified"] is False
    assert any("signature does not verify" in problem for problem in checked["problems"]), checked

    # Another artifact's genuine statement copied over this one's: signed, but about other bytes.
    assert (await verify(server, job, "other"))["verified"] is True
    async with server.state.db.read() as conn:
        copied = (
            await conn.execute(
                select(provenance_statements.c.envelope).where(
                    provenance_statements.c.artifact_id == other["id"]
                )
            )
        ).scalar_one()
    await alter_envelope(server, artifact["id"], lambda _: json.loads(copied))
    checked = await verify(server, job, "dist")
    assert checked["verified"] is False
    assert any("subject is 'other', not the artifact 'dist'" in p for p in checked["problems"]), checked
    assert any(f"the artifact's sha256:{artifact['sha256']}" in p for p in checked["problems"]), checked

    # The signature replaced.
    def zero_signature(envelope: dict[str, Any]) -> dict[str, Any]:
        keyid = envelope["signatures"][0]["keyid"]
        return {**envelope, "signatures": [{"keyid": keyid, "sig": base64.b64encode(b"\0" * 64).decode()}]}

    await alter_envelope(server, other["id"], zero_signature)
    assert (await verify(server, job, "other"))["verified"] is False


async def test_concurrent_first_requests_mint_one_statement_and_all_see_it(server: InProcessServer) -> None:
    job = await dispatched_job(server)
    artifact = await publish(server.client, job, "dist", b"asked for by many at once")
    service = server.state.parts.need(PROVENANCE)
    answers = await asyncio.gather(*(service.statement(job.run_id, "dist") for _ in range(8)))
    assert len({stored.envelope for _, stored in answers}) == 1
    async with server.state.db.read() as conn:
        count = (
            await conn.execute(
                select(func.count())
                .select_from(provenance_statements)
                .where(provenance_statements.c.artifact_id == artifact["id"])
            )
        ).scalar_one()
    assert count == 1


@pytest.fixture
def keys() -> tuple[SigningKey, SigningKey]:
    return SigningKey.generate(), SigningKey.generate()


async def test_a_rotated_key_signs_new_statements_and_the_old_ones_still_verify(
    database_url: str, tmp_path: Path, keys: tuple[SigningKey, SigningKey]
) -> None:
    old, new = keys
    home = tmp_path / "home"
    async with in_process_server(
        database_url, home, env={**ENV, "CONVEYOR_PROVENANCE_KEY": old.private.private_bytes_raw().hex()}
    ) as first:
        job = await dispatched_job(first)
        await publish(first.client, job, "before", b"made before the rotation")
        before = await verify(first, job, "before")
        assert before["verified"] is True and before["key_id"] == old.key_id
        await publish(first.client, job, "after", b"asked for after the rotation")

    key_file = tmp_path / "new.key"
    key_file.write_text(new.as_pem())
    async with in_process_server(
        database_url, home, env={**ENV, "CONVEYOR_PROVENANCE_KEY_FILE": str(key_file)}
    ) as second:
        still = await verify(second, job, "before")
        assert still["verified"] is True, still["problems"]
        assert still["key_id"] == old.key_id and still["envelope"] == before["envelope"]
        after = await verify(second, job, "after")
        assert after["verified"] is True and after["key_id"] == new.key_id
        async with second.state.db.read() as conn:
            recorded = {row.key_id for row in await conn.execute(select(provenance_keys.c.key_id))}
        assert recorded == {old.key_id, new.key_id}


async def test_without_a_configured_key_a_coordinator_generates_one_and_keeps_it(
    database_url: str, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    async with in_process_server(database_url, home, env=ENV) as first:
        generated = first.state.parts.need(PROVENANCE).key
        path = first.state.settings.home / GENERATED_PROVENANCE_KEY
    assert path.stat().st_mode & 0o777 == 0o600
    async with in_process_server(database_url, home, env=ENV) as second:
        assert second.state.parts.need(PROVENANCE).key.key_id == generated.key_id


async def set_knobs(server: InProcessServer, **values: int) -> None:
    answer = await server.client.patch("/api/v1/admin/cluster-settings", json=values, headers=server.auth())
    assert answer.status_code == 200, answer.text


async def statement_ids(server: InProcessServer) -> set[str]:
    async with server.state.db.read() as conn:
        return {row.artifact_id for row in await conn.execute(select(provenance_statements.c.artifact_id))}


async def test_provenance_retention_days_sweeps_old_statements_and_they_are_not_minted_again(
    server: InProcessServer,
) -> None:
    job = await dispatched_job(server)
    first = await publish(server.client, job, "first", b"one")
    second = await publish(server.client, job, "second", b"two")
    for name in ("first", "second"):
        assert (await verify(server, job, name))["verified"] is True
    service = server.state.parts.need(PROVENANCE)

    # The default (0) keeps a statement as long as its artifact.
    assert await service.sweep(now=utc_now() + timedelta(days=400)) == 0
    assert await statement_ids(server) == {first["id"], second["id"]}

    await set_knobs(server, provenance_retention_days=2)
    assert await service.sweep(now=utc_now() + timedelta(days=1)) == 0
    assert await service.sweep(now=utc_now() + timedelta(days=3)) == 2
    assert await statement_ids(server) == set()

    later = utc_now() + timedelta(days=3)
    service.clock = lambda: later
    expired = await server.client.get(provenance_path(job, "first"), headers=server.auth())
    assert expired.status_code == 410 and expired.json()["error"] == "provenance_expired"
    assert await statement_ids(server) == set()


async def test_the_statement_of_an_artifact_retention_deleted_goes_with_the_sweep(
    server: InProcessServer,
) -> None:
    job = await dispatched_job(server)
    short = await publish(server.client, job, "short", b"short-lived", retention_days=1)
    kept = await publish(server.client, job, "kept", b"kept")
    for name in ("short", "kept"):
        assert (await verify(server, job, name))["verified"] is True
    await service_of(server).sweep(now=utc_now() + timedelta(days=2))
    assert await server.state.parts.need(PROVENANCE).sweep() == 1
    assert await statement_ids(server) == {kept["id"]}
    assert short["id"] != kept["id"]
