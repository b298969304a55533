"""A Gitea-style `git` source over a file:// origin, signed pushes to it, and waiting for their deliveries."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from conveyor.ingest.service import DeliveryRecovery
from conveyor.ingest.signatures import hmac_hex
from tests.support.inprocess import InProcessServer
from tests.support.repos import git, make_repo
from tests.support.waiting import async_wait_until

SECRET = "gitea-secret"


async def git_source(
    server: InProcessServer,
    tmp_path: Path,
    workflows: dict[str, str] | None = None,
    *,
    repo: str = "team/app",
) -> tuple[str, str]:
    """A Gitea-style `git` source over a file:// origin at `tmp_path / "origin"` (with `workflows`, as
    `make_repo` takes them); (source id, the origin's HEAD)."""
    origin = make_repo(tmp_path / "origin", workflows)
    git(origin, "config", "uploadpack.allowFilter", "true")
    git(origin, "config", "uploadpack.allowAnySHA1InWant", "true")
    created = await server.client.post(
        "/api/v1/admin/sources",
        json={
            "kind": "git",
            "name": "gitea-app",
            "repo": repo,
            "clone_url": f"file://{origin}",
            "webhook_secret": SECRET,
            "signature_header": "X-Gitea-Signature",
        },
        headers=server.auth(),
    )
    assert created.status_code == 201, created.text
    return created.json()["id"], git(origin, "rev-parse", "HEAD")


async def push(
    server: InProcessServer,
    source_id: str,
    sha: str,
    *,
    ref: str = "refs/heads/main",
    delivery: str | None = None,
) -> str:
    """A signed Gitea-style push; without `delivery` the body's hash is its delivery id."""
    payload = {
        "ref": ref,
        "before": "0" * 40,
        "after": sha,
        "repository": {"full_name": "team/app"},
        "commits": [],
    }
    return await signed_post(server, source_id, payload, delivery=delivery)


async def signed_post(
    server: InProcessServer,
    source_id: str,
    payload: dict[str, Any],
    *,
    event: str = "push",
    delivery: str | None = None,
) -> str:
    """A Gitea-style webhook of `payload` signed with `SECRET`; the stored delivery's row id."""
    body = json.dumps(payload).encode()
    answer = await server.client.post(
        f"/webhooks/{source_id}",
        content=body,
        headers={
            "Content-Type": "application/json",
            "X-Gitea-Event": event,
            "X-Gitea-Signature": hmac_hex(SECRET, body),
            **({"X-Gitea-Delivery": delivery} if delivery else {}),
        },
    )
    assert answer.status_code == 202, answer.text
    return str(answer.json()["delivery"])


def without_recovery_scans(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the request's own kick processes the delivery: a recovery scan (every 200 ms in these tests)
    may otherwise get to it first on a loaded machine, and it has no hint."""

    async def no_scan(self: DeliveryRecovery) -> int:
        return 0

    monkeypatch.setattr(DeliveryRecovery, "scan_once", no_scan)


async def processed(server: InProcessServer, delivery: str) -> dict[str, Any]:
    async def done() -> dict[str, Any] | None:
        row = (await server.client.get(f"/api/v1/admin/deliveries/{delivery}", headers=server.auth())).json()
        return row if row["status"] != "received" else None

    return await async_wait_until(done, timeout=60, what="the delivery processed")
