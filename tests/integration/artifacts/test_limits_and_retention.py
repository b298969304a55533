"""The artifact knobs (docs/design/artifacts.md §6): a per-artifact and a per-run size limit, and retention,
whose sweep deletes an expired artifact's blob and keeps the blob a live artifact still uses."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta

from conveyor.model.ids import utc_now
from tests.integration.artifacts.conftest import commit, job_with_token, publish, service_of, upload
from tests.support.inprocess import InProcessServer


async def set_knobs(server: InProcessServer, **values: int) -> None:
    answer = await server.client.patch("/api/v1/admin/cluster-settings", json=values, headers=server.auth())
    assert answer.status_code == 200, answer.text


async def stored_blobs(server: InProcessServer) -> set[str]:
    return {found.sha256 async for found in service_of(server).blob_store.list_for_sweep()}


async def test_artifact_max_bytes_refuses_a_larger_upload_declared_or_streamed(
    server: InProcessServer,
) -> None:
    job = await job_with_token(server)
    await set_knobs(server, artifact_max_bytes=4096)
    declared = await upload(server.client, job, b"x" * 5000)
    assert declared.status_code == 413 and "artifact_max_bytes" in declared.json()["detail"]

    async def streamed() -> AsyncIterator[bytes]:
        for _ in range(5):
            yield b"y" * 1000

    chunked = await server.client.put(f"/api/v1/uploads/{job.job_id}", content=streamed(), headers=job.auth())
    assert chunked.status_code == 413
    assert await stored_blobs(server) == set()
    assert (await upload(server.client, job, b"z" * 4096)).status_code == 201


async def test_artifact_run_max_bytes_refuses_the_commit_that_would_pass_it(server: InProcessServer) -> None:
    job = await job_with_token(server)
    await set_knobs(server, artifact_run_max_bytes=3000)
    await publish(server.client, job, "one", b"a" * 2000)
    stored = (await upload(server.client, job, b"b" * 1500)).json()
    refused = await commit(server.client, job, "two", stored)
    assert refused.status_code == 413 and refused.json()["error"] == "run_quota_exceeded"
    await publish(server.client, job, "three", b"c" * 1000)
    listing = await server.client.get(f"/api/v1/admin/runs/{job.run_id}/artifacts", headers=server.auth())
    assert [a["name"] for a in listing.json()["items"]] == ["one", "three"]


async def test_artifact_retention_days_expires_an_artifact_and_the_sweep_deletes_its_blob_only(
    server: InProcessServer,
) -> None:
    await set_knobs(server, artifact_retention_days=3)
    job = await job_with_token(server)
    short = await publish(server.client, job, "short", b"short-lived", retention_days=1)
    kept = await publish(server.client, job, "kept", b"kept for the knob's days")
    shared_expired = await publish(server.client, job, "shared-old", b"shared", retention_days=1)
    await publish(server.client, job, "shared-new", b"shared")
    capped = await publish(server.client, job, "capped", b"asked too long", retention_days=90)
    assert capped["expires_at"][:10] == (utc_now() + timedelta(days=3)).date().isoformat()
    assert shared_expired["sha256"] != short["sha256"]

    totals = await service_of(server).sweep(now=utc_now() + timedelta(days=2))
    assert totals["artifacts"] == 2
    listing = await server.client.get(f"/api/v1/admin/runs/{job.run_id}/artifacts", headers=server.auth())
    assert sorted(a["name"] for a in listing.json()["items"]) == ["capped", "kept", "shared-new"]
    blobs = await stored_blobs(server)
    assert short["sha256"] not in blobs
    assert kept["sha256"] in blobs and shared_expired["sha256"] in blobs
