"""Two coordinators on one PostgreSQL database: a source changed through one is seen by the other's cache.

Both cache sources for a minute (`CONVEYOR_SOURCE_CACHE_TTL_MS`), so what ends a stale entry on the
other coordinator here is the NOTIFY sent with the change, not the TTL.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from conveyor.ingest.signatures import github_signature
from tests.fakes.github import FakeGitHub
from tests.support.dispatch_stage import FAST
from tests.support.processes import ServerProcess
from tests.support.repos import PUSH_WORKFLOW, make_repo
from tests.support.waiting import async_wait_until

pytestmark = [pytest.mark.slow, pytest.mark.postgres_only]

OLD, NEW = "old-webhook-secret", "new-webhook-secret"
NODE_ENV = {
    **FAST,
    "CONVEYOR_SECRET_KEY": "2f" * 32,
    "CONVEYOR_SOURCE_CACHE_TTL_MS": "60000",
    "CONVEYOR_CLUSTER_LEASE_TTL_MS": "5000",
    "CONVEYOR_CLUSTER_LEASE_RENEW_MS": "500",
}


async def ping(client: httpx.AsyncClient, node: ServerProcess, source_id: str, secret: str) -> int:
    body = json.dumps({"zen": "hi"}).encode()
    headers = {
        "Content-Type": "application/json",
        "X-GitHub-Event": "ping",
        "X-GitHub-Delivery": "d-ping",
        "X-Hub-Signature-256": github_signature(secret, body),
    }
    answer = await client.post(f"{node.url}/webhooks/{source_id}", content=body, headers=headers)
    return answer.status_code


async def test_a_change_through_one_coordinator_reaches_the_others_cache(
    postgres_url: str, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path / "repo", {"ci": PUSH_WORKFLOW})
    with contextlib.ExitStack() as cleanup, FakeGitHub(repos={"acme/app": repo}) as github:
        node_a = ServerProcess(
            tmp_path / "a", database_url=postgres_url, env={**NODE_ENV, "CONVEYOR_INSTANCE_ID": "a"}
        )
        cleanup.callback(node_a.stop)
        node_b = ServerProcess(
            tmp_path / "b", database_url=postgres_url, env={**NODE_ENV, "CONVEYOR_INSTANCE_ID": "b"}
        )
        cleanup.callback(node_b.stop)
        await asyncio.gather(asyncio.to_thread(node_a.wait_ready), asyncio.to_thread(node_b.wait_ready))
        token = node_a.owner_token_or_none() or node_b.owner_token()
        async with httpx.AsyncClient(timeout=30) as client:
            auth = {"Authorization": f"Bearer {token}"}

            async def admin(method: str, path: str, **kwargs: Any) -> httpx.Response:
                return await client.request(
                    method, f"{node_a.url}/api/v1/admin{path}", headers=auth, **kwargs
                )

            created = await admin(
                "POST",
                "/sources",
                json=github.source_body("acme/app", OLD),
            )
            assert created.status_code == 201, created.text
            source_id = created.json()["id"]
            assert await ping(client, node_b, source_id, OLD) == 200  # B now holds the old secret

            async def b_answers(secret: str, status: int) -> bool:
                return await ping(client, node_b, source_id, secret) == status

            rotated_at = time.monotonic()
            assert (
                await admin("PATCH", f"/sources/{source_id}", json={"webhook_secret": NEW})
            ).status_code == 200
            await async_wait_until(lambda: b_answers(OLD, 401), timeout=20, what="B to refuse the old secret")
            took = time.monotonic() - rotated_at
            assert took < 60, "seen before the TTL could have expired"
            assert await ping(client, node_b, source_id, NEW) == 200

            assert (await admin("PATCH", f"/sources/{source_id}", json={"enabled": False})).status_code == 200
            await async_wait_until(
                lambda: b_answers(NEW, 404), timeout=20, what="B to refuse the disabled source"
            )
