"""A GitHub source on the fake GitHub API, signed webhook posts to an in-process server, and what became of a delivery."""

from __future__ import annotations

import json
from typing import Any

import httpx

from conveyor.ingest.signatures import github_signature
from conveyor.secrets.service import SECRETS
from tests.fakes.github import FakeGitHub
from tests.support.inprocess import InProcessServer
from tests.support.waiting import async_wait_until

SECRET = "s3cret-webhook"


async def add_github_source(
    server: InProcessServer, github: FakeGitHub, webhook_secret: str = SECRET
) -> dict[str, Any]:
    answer = await server.client.post(
        "/api/v1/admin/sources",
        json={
            "kind": "github",
            "name": "acme/app",
            "repo": "acme/app",
            "api_url": github.url,
            "webhook_secret": webhook_secret,
        },
        headers=server.auth(),
    )
    assert answer.status_code == 201, answer.text
    source: dict[str, Any] = answer.json()
    async with server.state.db.transaction() as conn:
        await server.state.parts.need(SECRETS).set_source_secret(
            conn, source["id"], "api_token", "ghp_fake", updated_by="test"
        )
    return source


async def post(
    server: InProcessServer,
    source_id: str,
    payload: dict[str, Any],
    *,
    event: str = "push",
    delivery: str = "d-1",
    secret: str = SECRET,
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    body = json.dumps(payload).encode()
    all_headers = {
        "Content-Type": "application/json",
        "X-GitHub-Event": event,
        "X-GitHub-Delivery": delivery,
        "X-Hub-Signature-256": github_signature(secret, body),
        **(headers or {}),
    }
    return await server.client.post(f"/webhooks/{source_id}", content=body, headers=all_headers)


async def delivery_status(server: InProcessServer, delivery_id: str) -> dict[str, Any]:
    answer = await server.client.get(f"/api/v1/admin/deliveries/{delivery_id}", headers=server.auth())
    assert answer.status_code == 200, answer.text
    return answer.json()  # type: ignore[no-any-return]


async def processed(server: InProcessServer, delivery_id: str) -> dict[str, Any]:
    async def done() -> dict[str, Any] | None:
        row = await delivery_status(server, delivery_id)
        return row if row["status"] != "received" else None

    return await async_wait_until(done, timeout=20, what=f"delivery {delivery_id} processed")
