"""The webhook route serves sources from a per-coordinator cache, and a change is seen at once.

The cache's TTL is set to a minute here, so a test that passes shows the commit-time invalidation, not
the TTL, at work.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from conveyor.ingest.service import INGEST
from conveyor.ingest.signatures import github_signature
from tests.fakes.github import FakeGitHub
from tests.integration.ingest.conftest import FAST
from tests.support.github_ingest import add_github_source
from tests.support.inprocess import InProcessServer
from tests.support.waiting import async_wait_until

OLD, NEW = "old-webhook-secret", "new-webhook-secret"


@pytest.fixture
def server_env() -> dict[str, str]:
    return {**FAST, "CONVEYOR_SOURCE_CACHE_TTL_MS": "60000"}


async def ping(server: InProcessServer, source_id: str, secret: str) -> httpx.Response:
    body = json.dumps({"zen": "hi"}).encode()
    headers = {
        "Content-Type": "application/json",
        "X-GitHub-Event": "ping",
        "X-GitHub-Delivery": "d-ping",
        "X-Hub-Signature-256": github_signature(secret, body),
    }
    return await server.client.post(f"/webhooks/{source_id}", content=body, headers=headers)


async def source(server: InProcessServer, github: FakeGitHub) -> dict[str, Any]:
    return await add_github_source(server, github, webhook_secret=OLD)


async def ping_until_cached(server: InProcessServer, source_id: str) -> None:
    """Ping with the old secret until the source is held in the cache.

    A load that an invalidation overtakes is not kept, and on PostgreSQL the notification of the source's
    own creation arrives through LISTEN some time after the commit: a first ping may not be cached.
    """

    async def cached() -> bool:
        assert (await ping(server, source_id, OLD)).status_code == 200
        return server.state.parts.need(INGEST).sources.get(source_id) is not None

    await async_wait_until(cached, what="the source to be held in the cache")


async def test_a_rotated_secret_is_refused_at_once_despite_the_cache(
    server: InProcessServer, github: FakeGitHub
) -> None:
    created = await source(server, github)
    await ping_until_cached(server, created["id"])  # cached with the old secret
    patched = await server.client.patch(
        f"/api/v1/admin/sources/{created['id']}", json={"webhook_secret": NEW}, headers=server.auth()
    )
    assert patched.status_code == 200, patched.text
    refused = await ping(server, created["id"], OLD)
    assert refused.status_code == 401 and refused.json()["error"] == "bad_signature"
    assert (await ping(server, created["id"], NEW)).status_code == 200


async def test_a_secret_written_through_the_secrets_api_is_seen_at_once(
    server: InProcessServer, github: FakeGitHub
) -> None:
    created = await source(server, github)
    await ping_until_cached(server, created["id"])
    answer = await server.client.put(
        f"/api/v1/admin/secrets/source:{created['id']}/webhook_secret_next",
        json={"value": NEW},
        headers=server.auth(),
    )
    assert answer.status_code in (200, 201), answer.text
    assert (await ping(server, created["id"], NEW)).status_code == 200, "the next secret is accepted"
    deleted = await server.client.delete(
        f"/api/v1/admin/secrets/source:{created['id']}/webhook_secret_next", headers=server.auth()
    )
    assert deleted.status_code == 204, deleted.text
    assert (await ping(server, created["id"], NEW)).status_code == 401


async def test_a_disabled_or_deleted_source_stops_being_accepted_at_once(
    server: InProcessServer, github: FakeGitHub
) -> None:
    created = await source(server, github)
    await ping_until_cached(server, created["id"])
    patched = await server.client.patch(
        f"/api/v1/admin/sources/{created['id']}", json={"enabled": False}, headers=server.auth()
    )
    assert patched.status_code == 200, patched.text
    disabled = await ping(server, created["id"], OLD)
    assert disabled.status_code == 404 and disabled.json()["error"] == "unknown_source"
    await server.client.patch(
        f"/api/v1/admin/sources/{created['id']}", json={"enabled": True}, headers=server.auth()
    )
    assert (await ping(server, created["id"], OLD)).status_code == 200
    removed = await server.client.delete(f"/api/v1/admin/sources/{created['id']}", headers=server.auth())
    assert removed.status_code == 204
    assert (await ping(server, created["id"], OLD)).status_code == 404
