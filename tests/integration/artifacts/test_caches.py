"""The cache routes a job's credential opens (docs/design/caches.md §2–§4), on SQLite and PostgreSQL: the
scope rule against stored entries, the first complete save of a key winning, and refusals."""

from __future__ import annotations

import asyncio
import hashlib
import os
from typing import Any

from sqlalchemy import update

from conveyor.db.tables import runs
from tests.integration.artifacts.conftest import Job, upload
from tests.support.caches import job_for, push_event
from tests.support.inprocess import InProcessServer


def pr_event(number: int, base: str) -> dict[str, Any]:
    return {
        "type": "pr",
        "repo": "acme/app",
        "source": "app",
        "ref": f"refs/pull/{number}/head",
        "base_branch": base,
        "default_branch": "main",
    }


async def save(server: InProcessServer, job: Job, key: str, data: bytes) -> Any:
    stored = await upload(server.client, job, data)
    assert stored.status_code == 201, stored.text
    body = {"key": key, **{k: stored.json()[k] for k in ("upload_id", "sha256", "size")}}
    return await server.client.post(f"/api/v1/jobs/{job.job_id}/caches", json=body, headers=job.auth())


async def lookup(server: InProcessServer, job: Job, key: str, *restore: str) -> dict[str, Any]:
    answer = await server.client.post(
        f"/api/v1/jobs/{job.job_id}/caches/lookup",
        json={"key": key, "restore_keys": list(restore)},
        headers=job.auth(),
    )
    assert answer.status_code == 200, answer.text
    found: dict[str, Any] = answer.json()
    return found


async def test_a_feature_branch_reads_the_defaults_entries_never_a_siblings(server: InProcessServer) -> None:
    sibling = await job_for(server, push_event("sibling"))
    assert (await save(server, sibling, "deps-1", b"sibling bytes")).status_code == 201
    feature = await job_for(server, push_event("feat"))
    assert (await lookup(server, feature, "deps-1", "deps-"))["kind"] == "miss"
    # The sibling's bytes are not readable through the content route either.
    sibling_sha = hashlib.sha256(b"sibling bytes").hexdigest()
    refused = await server.client.get(
        f"/api/v1/jobs/{feature.job_id}/caches/content",
        params={"sha256": sibling_sha},
        headers=feature.auth(),
    )
    assert refused.status_code == 404 and refused.json()["error"] == "not_found"

    main = await job_for(server, push_event("main"))
    assert (await save(server, main, "deps-0", b"main bytes")).status_code == 201
    found = await lookup(server, feature, "deps-1", "deps-")
    assert found["kind"] == "partial"
    assert (found["entry"]["key"], found["entry"]["scope"]) == ("deps-0", "refs/heads/main")
    content = await server.client.get(
        f"/api/v1/jobs/{feature.job_id}/caches/content",
        params={"sha256": found["entry"]["sha256"]},
        headers=feature.auth(),
    )
    assert content.status_code == 200 and content.content == b"main bytes"
    # The sibling reads its own entry exactly.
    assert (await lookup(server, sibling, "deps-1"))["kind"] == "exact"


async def test_a_pull_request_reads_its_base_branchs_entries(server: InProcessServer) -> None:
    release = await job_for(server, push_event("release"))
    assert (await save(server, release, "deps-r", b"release")).status_code == 201
    pull = await job_for(server, pr_event(7, "release"))
    found = await lookup(server, pull, "deps-r")
    assert found["kind"] == "exact" and found["entry"]["scope"] == "refs/heads/release"
    other_pull = await job_for(server, pr_event(8, "develop"))
    assert (await lookup(server, other_pull, "deps-r"))["kind"] == "miss"


async def test_two_concurrent_saves_of_one_key_leave_one_complete_entry(server: InProcessServer) -> None:
    first, second = await job_for(server, push_event("main")), await job_for(server, push_event("main"))
    data = {first.job_id: os.urandom(300_000), second.job_id: os.urandom(300_000)}
    answers = await asyncio.gather(
        *(save(server, job, "deps-x", data[job.job_id]) for job in (first, second))
    )
    assert sorted(a.status_code for a in answers) == [200, 201]
    assert sorted(a.json()["saved"] for a in answers) == [False, True]
    winner = first if answers[0].status_code == 201 else second
    reader = await job_for(server, push_event("main"))
    found = await lookup(server, reader, "deps-x")
    assert found["kind"] == "exact"
    assert found["entry"]["sha256"] == hashlib.sha256(data[winner.job_id]).hexdigest()
    content = await server.client.get(
        f"/api/v1/jobs/{reader.job_id}/caches/content",
        params={"sha256": found["entry"]["sha256"]},
        headers=reader.auth(),
    )
    assert content.content == data[winner.job_id]
    # A later save of the key is dropped the same way: keys are immutable.
    again = await save(server, reader, "deps-x", b"late")
    assert again.status_code == 200 and again.json() == {"saved": False, "reason": "the key exists"}


async def test_bad_keys_another_jobs_credential_and_a_wrong_digest_are_refused(
    server: InProcessServer,
) -> None:
    job = await job_for(server, push_event("main"))
    other = await job_for(server, push_event("main"))
    for body in (
        {"key": "a,b"},
        {"key": ""},
        {"key": "k", "restore_keys": ["x" * 600]},
        {"key": "k", "x": 1},
    ):
        answer = await server.client.post(
            f"/api/v1/jobs/{job.job_id}/caches/lookup", json=body, headers=job.auth()
        )
        assert answer.status_code == 422, (body, answer.text)
        assert "error" in answer.json()
    forbidden = await server.client.post(
        f"/api/v1/jobs/{job.job_id}/caches/lookup", json={"key": "k"}, headers=other.auth()
    )
    assert forbidden.status_code == 403
    stored = (await upload(server.client, job, b"bytes")).json()
    wrong = await server.client.post(
        f"/api/v1/jobs/{job.job_id}/caches",
        json={"key": "k", "upload_id": stored["upload_id"], "sha256": "0" * 64, "size": stored["size"]},
        headers=job.auth(),
    )
    assert wrong.status_code == 400 and wrong.json()["error"] == "digest_mismatch"
    assert (await lookup(server, job, "k"))["kind"] == "miss"


# -- knobs (docs/design/caches.md §6) ----------------------------------------------------------------


async def set_knobs(server: InProcessServer, **values: int) -> None:
    answer = await server.client.patch("/api/v1/admin/cluster-settings", json=values, headers=server.auth())
    assert answer.status_code == 200, answer.text


async def test_cache_max_entry_bytes_refuses_a_larger_entry_and_leaves_artifacts_alone(
    server: InProcessServer,
) -> None:
    job = await job_for(server, push_event("main"))
    await set_knobs(server, cache_max_entry_bytes=4096)
    refused = await server.client.put(
        f"/api/v1/uploads/{job.job_id}", params={"purpose": "cache"}, content=b"x" * 5000, headers=job.auth()
    )
    assert refused.status_code == 413 and "cache_max_entry_bytes" in refused.json()["detail"]
    # An artifact's upload keeps its own limit.
    assert (await upload(server.client, job, b"x" * 5000)).status_code == 201
    # A commit naming a larger upload (one sent without the purpose) is refused too, and files nothing.
    stored = (await upload(server.client, job, b"y" * 5000)).json()
    body = {"key": "big", **{k: stored[k] for k in ("upload_id", "sha256", "size")}}
    too_big = await server.client.post(f"/api/v1/jobs/{job.job_id}/caches", json=body, headers=job.auth())
    assert too_big.status_code == 413 and too_big.json()["error"] == "payload_too_large"
    assert (await lookup(server, job, "big"))["kind"] == "miss"
    assert (await save(server, job, "small", b"z" * 4096)).status_code == 201


async def test_cache_max_total_bytes_evicts_the_least_recently_used_entries(server: InProcessServer) -> None:
    await set_knobs(server, cache_max_total_bytes=2500)
    job = await job_for(server, push_event("main"))
    feature = await job_for(server, push_event("feat"))
    assert (await save(server, job, "a", b"a" * 1000)).status_code == 201
    assert (await save(server, feature, "b", b"b" * 1000)).status_code == 201
    assert (await lookup(server, job, "a"))["kind"] == "exact"  # a is now used more recently than b
    third = await save(server, job, "c", b"c" * 1000)
    assert third.status_code == 201 and third.json()["evicted"] == 1
    assert [(await lookup(server, feature, key))["kind"] for key in ("a", "b", "c")] == [
        "exact",
        "miss",
        "exact",
    ]
    # Another repository's entries count for their own repository only.
    other = await job_for(server, {**push_event("main"), "repo": "acme/other"})
    async with server.state.db.transaction() as conn:
        await conn.execute(update(runs).where(runs.c.id == other.run_id).values(repo="acme/other"))
    assert (await save(server, other, "a", b"o" * 2000)).json()["evicted"] == 0
    assert (await lookup(server, job, "a"))["kind"] == "exact"


async def test_cache_ttl_days_expires_entries_unused_that_long_and_the_sweep_deletes_their_blobs(
    server: InProcessServer,
) -> None:
    from datetime import timedelta

    from conveyor.model.ids import utc_now
    from tests.integration.artifacts.conftest import service_of

    await set_knobs(server, cache_ttl_days=2)
    job = await job_for(server, push_event("main"))
    assert (await save(server, job, "old", b"old entry")).status_code == 201
    service = service_of(server)
    kept = await service.sweep(now=utc_now() + timedelta(days=1))
    assert kept["cache_entries"] == 0
    assert (await lookup(server, job, "old"))["kind"] == "exact"  # used now: its two days start again
    swept = await service.sweep(now=utc_now() + timedelta(days=3))
    assert swept["cache_entries"] == 1
    assert (await lookup(server, job, "old"))["kind"] == "miss"
    stored = {found.sha256 async for found in service.blob_store.list_for_sweep()}
    assert hashlib.sha256(b"old entry").hexdigest() not in stored


# -- admin routes (docs/design/caches.md §7) ---------------------------------------------------------


async def test_admin_lists_filters_and_deletes_entries_by_permission(server: InProcessServer) -> None:
    main = await job_for(server, push_event("main"))
    assert (await save(server, main, "pip-1", b"p" * 10)).status_code == 201
    assert (await save(server, main, "npm-1", b"n" * 20)).status_code == 201
    auditor, operator = await server.mint("auditor"), await server.mint("operator")

    listed = await server.client.get("/api/v1/admin/caches", headers=server.auth(auditor))
    assert listed.status_code == 200, listed.text
    body = listed.json()
    assert [(e["key"], e["scope"], e["size"]) for e in body["items"]] == [
        ("npm-1", "refs/heads/main", 20),
        ("pip-1", "refs/heads/main", 10),
    ]
    assert body["total_bytes"] == 30
    source = body["items"][0]["source"]
    prefixed = await server.client.get(
        "/api/v1/admin/caches", params={"key_prefix": "pip-", "source": source}, headers=server.auth()
    )
    assert [e["key"] for e in prefixed.json()["items"]] == ["pip-1"]
    elsewhere = await server.client.get(
        "/api/v1/admin/caches", params={"source": "nope"}, headers=server.auth()
    )
    assert elsewhere.json()["items"] == []

    pip = prefixed.json()["items"][0]["id"]
    refused = await server.client.delete(f"/api/v1/admin/caches/{pip}", headers=server.auth(auditor))
    assert refused.status_code == 403 and "cache.manage" in refused.json()["detail"]
    deleted = await server.client.delete(f"/api/v1/admin/caches/{pip}", headers=server.auth(operator))
    assert deleted.status_code == 204
    again = await server.client.delete(f"/api/v1/admin/caches/{pip}", headers=server.auth(operator))
    assert again.status_code == 404 and again.json()["error"] == "not_found"
    assert (await lookup(server, main, "pip-1"))["kind"] == "miss"
    assert (await lookup(server, main, "npm-1"))["kind"] == "exact"


async def test_metrics_count_lookups_saves_and_restored_bytes(server: InProcessServer) -> None:
    def sample(text: str, name: str) -> float:
        line = next((ln for ln in text.splitlines() if ln.startswith(name + " ")), None)
        return 0.0 if line is None else float(line.split()[-1])

    async def metrics() -> str:
        return (await server.client.get("/metrics")).text

    before = await metrics()
    job = await job_for(server, push_event("main"))
    await lookup(server, job, "m-1")
    assert (await save(server, job, "m-1", b"m" * 100)).status_code == 201
    assert (await save(server, job, "m-1", b"n" * 100)).status_code == 200
    found = await lookup(server, job, "m-2", "m-")
    await server.client.get(
        f"/api/v1/jobs/{job.job_id}/caches/content",
        params={"sha256": found["entry"]["sha256"]},
        headers=job.auth(),
    )
    after = await metrics()
    for name, grew in [
        ('conveyor_cache_lookups_total{kind="miss"}', 1),
        ('conveyor_cache_lookups_total{kind="partial"}', 1),
        ('conveyor_cache_saves_total{outcome="saved"}', 1),
        ('conveyor_cache_saves_total{outcome="dropped"}', 1),
        ("conveyor_cache_saved_bytes_total", 100),
        ("conveyor_cache_restored_bytes_total", 100),
    ]:
        assert sample(after, name) - sample(before, name) == grew, name
