"""The agents' artifact routes and the admin routes (docs/design/artifacts.md §4, §6, §7): a job's
credential opens its own run's artifacts only, an upload is visible once committed, downloads serve
ranges, and the roles decide who reads them."""

from __future__ import annotations

import hashlib
import os

from sqlalchemy import delete, func, select, update

from conveyor.db.tables import artifact_uploads, blobs, cache_entries, dispatch_queue
from tests.integration.artifacts.conftest import commit, job_with_token, publish, upload
from tests.support.inprocess import InProcessServer


async def test_an_upload_is_visible_only_once_committed_and_reads_back_whole_or_by_range(
    server: InProcessServer,
) -> None:
    client = server.client
    job = await job_with_token(server)
    data = os.urandom(3 * 1024 * 1024 + 11)
    stored = await upload(client, job, data)
    assert stored.status_code == 201
    listing = await client.get(f"/api/v1/admin/runs/{job.run_id}/artifacts", headers=server.auth())
    assert listing.json()["items"] == []

    made = await commit(client, job, "dist", stored.json())
    assert made.status_code == 201, made.text
    assert made.json()["sha256"] == hashlib.sha256(data).hexdigest()
    listing = await client.get(f"/api/v1/admin/runs/{job.run_id}/artifacts", headers=server.auth())
    assert [(a["name"], a["size"], a["job"]) for a in listing.json()["items"]] == [
        ("dist", len(data), "build")
    ]

    whole = await client.get(f"/api/v1/jobs/{job.job_id}/artifacts/dist/content", headers=job.auth())
    assert whole.status_code == 200 and whole.content == data
    assert whole.headers["etag"] == f'"{hashlib.sha256(data).hexdigest()}"'
    url = f"/api/v1/admin/runs/{job.run_id}/artifacts/dist/content"
    part = await client.get(url, headers={**server.auth(), "Range": "bytes=100-199"})
    assert part.status_code == 206 and part.content == data[100:200]
    assert part.headers["content-range"] == f"bytes 100-199/{len(data)}"
    tail = await client.get(url, headers={**server.auth(), "Range": "bytes=-5"})
    assert tail.status_code == 206 and tail.content == data[-5:]
    beyond = await client.get(url, headers={**server.auth(), "Range": f"bytes={len(data)}-"})
    assert beyond.status_code == 416 and beyond.headers["content-range"] == f"bytes */{len(data)}"


async def test_a_jobs_credential_opens_only_its_own_jobs_routes_and_dies_with_the_dispatch(
    server: InProcessServer,
) -> None:
    client = server.client
    mine = await job_with_token(server)
    other = await job_with_token(server)
    await publish(client, mine, "dist", b"mine" * 100)
    stored = (await upload(client, mine, b"second")).json()
    foreign = {"Authorization": f"Bearer {other.token}"}

    assert (
        await client.put(f"/api/v1/uploads/{mine.job_id}", content=b"x", headers=foreign)
    ).status_code == 403
    body = {
        "name": "x",
        "upload_id": stored["upload_id"],
        "sha256": stored["sha256"],
        "size": 6,
        "format": "file",
    }
    assert (
        await client.post(f"/api/v1/jobs/{mine.job_id}/artifacts", json=body, headers=foreign)
    ).status_code == 403
    download = await client.get(f"/api/v1/jobs/{mine.job_id}/artifacts/dist/content", headers=foreign)
    assert download.status_code == 403 and download.json()["error"] == "forbidden"
    # Another job's artifacts are not visible through a credential of this one either.
    assert (await client.get(f"/api/v1/jobs/{other.job_id}/artifacts", headers=foreign)).json()["items"] == []

    agent_token = {"Authorization": "Bearer cvy_agent_" + "0" * 64}
    assert (await client.get(f"/api/v1/jobs/{mine.job_id}/artifacts", headers=agent_token)).status_code == 401
    admin = {"Authorization": f"Bearer {server.owner_token}"}
    assert (await client.get(f"/api/v1/jobs/{mine.job_id}/artifacts", headers=admin)).status_code == 401
    assert (await client.get(f"/api/v1/jobs/{mine.job_id}/artifacts")).status_code == 401
    # The credential is checked before the body: a caller without one learns nothing of its form.
    for path in ("artifacts", "caches", "caches/lookup", "test-reports"):
        refused = await client.post(f"/api/v1/jobs/{mine.job_id}/{path}", json={"bad": 1}, headers=foreign)
        assert refused.status_code == 403 and refused.json()["error"] == "forbidden", (path, refused.text)

    # The job ends: its queue row goes, and the credential with it.
    async with server.state.db.transaction() as conn:
        await conn.execute(delete(dispatch_queue).where(dispatch_queue.c.job_id == mine.job_id))
    ended = await client.get(f"/api/v1/jobs/{mine.job_id}/artifacts", headers=mine.auth())
    assert ended.status_code == 401 and ended.json()["error"] == "invalid_token"


async def test_an_auditor_downloads_and_an_operator_without_artifact_read_is_refused(
    server: InProcessServer,
) -> None:
    job = await job_with_token(server)
    await publish(server.client, job, "report", b"evidence")
    url = f"/api/v1/admin/runs/{job.run_id}/artifacts/report/content"
    auditor = await server.mint("auditor")
    read = await server.client.get(url, headers=server.auth(auditor))
    assert read.status_code == 200 and read.content == b"evidence"
    operator = await server.mint("operator")
    refused = await server.client.get(url, headers=server.auth(operator))
    assert refused.status_code == 403
    assert "artifact.read" in refused.json()["detail"]
    listing = await server.client.get(
        f"/api/v1/admin/runs/{job.run_id}/artifacts", headers=server.auth(operator)
    )
    assert listing.status_code == 403
    scoped = await server.mint("auditor", routing_key="github:acme/other")
    assert (await server.client.get(url, headers=server.auth(scoped))).status_code == 404


async def test_commit_refuses_a_wrong_digest_a_taken_name_and_an_unknown_upload(
    server: InProcessServer,
) -> None:
    client = server.client
    job = await job_with_token(server)
    await publish(client, job, "dist", b"first")
    stored = (await upload(client, job, b"again")).json()
    wrong = await commit(client, job, "other", {**stored, "sha256": "0" * 64})
    assert wrong.status_code == 400 and wrong.json()["error"] == "digest_mismatch"
    stored = (await upload(client, job, b"again")).json()
    taken = await commit(client, job, "dist", stored)
    assert taken.status_code == 409 and taken.json()["error"] == "artifact_exists"
    missing = await commit(client, job, "later", {**stored, "upload_id": "nope"})
    assert missing.status_code == 404
    bad_name = await commit(client, job, "../etc", (await upload(client, job, b"x")).json())
    assert bad_name.status_code == 400 and bad_name.json()["error"] == "invalid_name"


async def test_an_artifact_or_cache_commit_of_bytes_the_sweep_took_is_refused_and_keeps_the_upload(
    server: InProcessServer,
) -> None:
    client = server.client
    job = await job_with_token(server)
    stored = (await upload(client, job, b"swept bytes")).json()
    # What the blob sweep does first to bytes nothing references (docs/design/artifacts.md §2).
    async with server.state.db.transaction() as conn:
        await conn.execute(update(blobs).where(blobs.c.sha256 == stored["sha256"]).values(state="doomed"))
    made = await commit(client, job, "dist", stored)
    assert made.status_code == 409 and made.json()["error"] == "upload_expired", made.text
    assert "upload the artifact again" in made.json()["detail"]
    body = {"key": "deps", **{k: stored[k] for k in ("upload_id", "sha256", "size")}}
    cached = await client.post(f"/api/v1/jobs/{job.job_id}/caches", json=body, headers=job.auth())
    assert cached.status_code == 409 and cached.json()["error"] == "upload_expired", cached.text
    assert "upload the entry again" in cached.json()["detail"]
    # Nothing was committed, and the refused commits left the upload in place.
    listing = await client.get(f"/api/v1/admin/runs/{job.run_id}/artifacts", headers=server.auth())
    assert listing.json()["items"] == []
    async with server.state.db.read() as conn:
        assert await conn.scalar(select(func.count()).select_from(cache_entries)) == 0
        assert (
            await conn.scalar(
                select(func.count())
                .select_from(artifact_uploads)
                .where(artifact_uploads.c.id == stored["upload_id"])
            )
            == 1
        )


async def test_an_upload_that_announces_a_digest_is_refused_when_the_bytes_hash_otherwise(
    server: InProcessServer,
) -> None:
    client = server.client
    job = await job_with_token(server)
    data = os.urandom(2 * 1024 * 1024 + 1)
    route = f"/api/v1/uploads/{job.job_id}"
    wrong = hashlib.sha256(b"something else").hexdigest()

    refused = await client.put(route, params={"sha256": wrong}, content=data, headers=job.auth())
    assert refused.status_code == 409 and refused.json()["error"] == "digest_mismatch", refused.text
    malformed = await client.put(route, params={"sha256": "ABC"}, content=data, headers=job.auth())
    assert malformed.status_code == 400 and malformed.json()["error"] == "invalid_digest"
    async with server.state.db.read() as conn:
        assert await conn.scalar(select(func.count()).select_from(blobs)) == 0
        assert await conn.scalar(select(func.count()).select_from(artifact_uploads)) == 0

    right = hashlib.sha256(data).hexdigest()
    stored = await client.put(route, params={"sha256": right}, content=data, headers=job.auth())
    assert stored.status_code == 201 and stored.json()["sha256"] == right
    assert (await commit(client, job, "dist", stored.json())).status_code == 201
    whole = await client.get(f"/api/v1/jobs/{job.job_id}/artifacts/dist/content", headers=job.auth())
    assert whole.content == data
