"""Fixtures for event tests: an in-process server with fast event loops, and a local repository."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.inprocess import InProcessServer, in_process_server
from tests.support.repos import commit_all, git, make_repo, write_workflows
from tests.support.waiting import async_wait_until

FAST = {
    "CONVEYOR_SWEEP_INTERVAL_MS": "200",
    "CONVEYOR_CLUSTER_HEARTBEAT_INTERVAL_MS": "200",
    "CONVEYOR_EVENTS_POLL_SECONDS": "0.3",
    "CONVEYOR_EVENTS_SCAN_SECONDS": "0.3",
    "CONVEYOR_CRON_TICK_SECONDS": "0.3",
    "CONVEYOR_EVENTS_RETRY_BASE_SECONDS": "0.2",
    "CONVEYOR_EVENTS_RETRY_MAX_SECONDS": "0.5",
}

DEPLOY_WORKFLOW = """
from conveyor import event, workflow

deploy = workflow("deploy", on=[event("deploy.requested", match={"env": "prod"})])

@deploy.job(runs_on=["linux"])
def ship(ctx):
    ctx.sh(["echo", "ship"])
"""

CI_WORKFLOW = """
from conveyor import push, workflow

ci = workflow("ci", on=[push(branches=["main"])])

@ci.job(runs_on=["linux"])
def build(ctx):
    ctx.sh(["echo", "build"])
"""


class Events:
    """Helpers around one in-process server with a local source."""

    def __init__(self, server: InProcessServer, repo: Path) -> None:
        self.server = server
        self.repo = repo
        self.source_id = ""
        self.routing_key = ""

    async def api(self, method: str, path: str, token: str | None = None, **kwargs: Any) -> Any:
        headers = {**self.server.auth(token), **kwargs.pop("headers", {})}
        return await self.server.client.request(method, f"/api/v1/admin{path}", headers=headers, **kwargs)

    async def add_source(self, name: str = "app", repo: Path | None = None) -> dict[str, Any]:
        answer = await self.api(
            "POST", "/sources", json={"kind": "local", "name": name, "path": str(repo or self.repo)}
        )
        assert answer.status_code == 201, answer.text
        body: dict[str, Any] = answer.json()
        if not self.source_id:
            self.source_id, self.routing_key = body["id"], body["routing_key"]
        return body

    async def push(
        self, source_id: str | None = None, repo: Path | None = None, ref: str = "refs/heads/main"
    ) -> str:
        """Trigger HEAD of the repository and wait until the delivery is processed."""
        sha = git(repo or self.repo, "rev-parse", "HEAD")
        answer = await self.api(
            "POST", f"/sources/{source_id or self.source_id}/trigger", json={"ref": ref, "sha": sha}
        )
        assert answer.status_code == 202, answer.text
        delivery = answer.json()["delivery"]

        async def done() -> bool:
            row = (await self.api("GET", f"/deliveries/{delivery}")).json()
            return row["status"] != "received"

        await async_wait_until(done, timeout=30, what="the push processed")
        return delivery

    async def emit(self, name: str, payload: dict[str, Any] | None = None, **extra: Any) -> str:
        answer = await self.api("POST", "/events", json={"name": name, "payload": payload or {}, **extra})
        assert answer.status_code == 201, answer.text
        return str(answer.json()["event_id"])

    async def event(self, event_id: str) -> dict[str, Any]:
        answer = await self.api("GET", f"/events/{event_id}")
        assert answer.status_code == 200, answer.text
        return answer.json()  # type: ignore[no-any-return]

    async def wait_state(self, event_id: str, *states: str, timeout: float = 30) -> dict[str, Any]:
        async def reached() -> dict[str, Any] | None:
            body = await self.event(event_id)
            return body if body["event"]["state"] in states else None

        return await async_wait_until(reached, timeout=timeout, what=f"event {event_id} in {states}")

    async def registrations(self) -> list[dict[str, Any]]:
        answer = await self.api("GET", "/registrations", params={"limit": 500})
        assert answer.status_code == 200, answer.text
        return answer.json()["items"]  # type: ignore[no-any-return]


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "repo", {"ci": CI_WORKFLOW, "deploy": DEPLOY_WORKFLOW})


@pytest.fixture
async def events_server(
    database_url: str, tmp_path: Path, repo: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Events]:
    env = {**FAST, "CONVEYOR_TEST_MODE": "1", "CONVEYOR_TEST_EVENT_FAIL_FIRST_N": '{"flaky": 2, "doomed": 5}'}
    for key, value in env.items():  # the event settings read the process environment
        monkeypatch.setenv(key, value)
    async with in_process_server(database_url, tmp_path / "home", env=env) as server:
        yield Events(server, repo)


def rewrite(repo: Path, workflows: dict[str, str], message: str = "change") -> str:
    write_workflows(repo, workflows)
    return commit_all(repo, message)
