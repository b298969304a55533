"""A coordinator killed mid-dispatch on PostgreSQL: the other one processes the event after the lease,
one run in total, two attempts, one lease expiration."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.events.conftest import DEPLOY_WORKFLOW
from tests.integration.runtime.conftest import FAST_CLUSTER
from tests.support.http import HTTP
from tests.support.processes import ServerProcess
from tests.support.repos import git, make_repo
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture
def nodes() -> Iterator[list[ServerProcess]]:
    started: list[ServerProcess] = []
    yield started
    for process in started:
        process.stop()


def test_a_node_killed_mid_dispatch_loses_nothing_and_doubles_nothing(
    postgres_url: str, tmp_path: Path, nodes: list[ServerProcess]
) -> None:
    common = {
        **FAST_CLUSTER,
        "CONVEYOR_SECRET_KEY": "0f" * 32,
        "CONVEYOR_EVENTS_LEASE_SECONDS": "3",
        "CONVEYOR_EVENTS_SCAN_SECONDS": "0.5",
        "CONVEYOR_EVENTS_POLL_SECONDS": "0.5",
    }
    stalling = ServerProcess(
        tmp_path / "node-a",
        database_url=postgres_url,
        env={
            **common,
            "CONVEYOR_INSTANCE_ID": "node-a",
            "CONVEYOR_TEST_MODE": "1",
            "CONVEYOR_TEST_EVENT_STALL": "deploy.requested",
        },
    )
    nodes.append(stalling)
    stalling.wait_ready(timeout=120)
    token = stalling.owner_token()

    def api(base: str, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return HTTP.request(
            method,
            f"{base}/api/v1/admin{path}",
            headers={"Authorization": f"Bearer {token}"},
            timeout=30,
            **kwargs,
        )

    repo = make_repo(tmp_path / "repo", {"deploy": DEPLOY_WORKFLOW})
    source = api(
        stalling.url, "POST", "/sources", json={"kind": "local", "name": "app", "path": str(repo)}
    ).json()
    sha = git(repo, "rev-parse", "HEAD")
    api(stalling.url, "POST", f"/sources/{source['id']}/trigger", json={"ref": "refs/heads/main", "sha": sha})
    wait_until(
        lambda: api(stalling.url, "GET", "/registrations").json()["items"], timeout=60, what="registration"
    )
    emitted = api(
        stalling.url, "POST", "/events", json={"name": "deploy.requested", "payload": {"env": "prod"}}
    )
    event_id = emitted.json()["event_id"]
    wait_until(
        lambda: api(stalling.url, "GET", f"/events/{event_id}").json()["event"]["state"] == "leased",
        timeout=60,
        what="node-a holding the event",
    )
    # The lease commits before routing starts: kill only once the node is inside the routing
    # transaction (its runs written, not committed).
    wait_until(
        lambda: "stalling before finish" in stalling.output(), timeout=60, what="node-a stalling mid-dispatch"
    )
    stalling.signal(signal.SIGKILL)
    stalling.wait_exit()

    survivor = ServerProcess(
        tmp_path / "node-b", database_url=postgres_url, env={**common, "CONVEYOR_INSTANCE_ID": "node-b"}
    )
    nodes.append(survivor)
    survivor.wait_ready(timeout=120)

    def processed() -> dict[str, Any] | None:
        body = api(survivor.url, "GET", f"/events/{event_id}").json()
        return body if body["event"]["state"] == "processed" else None

    body = wait_until(processed, timeout=90, what="node-b processing the event after the lease")
    assert body["event"]["attempts"] == 2 and body["event"]["match_outcome"] == "matched"
    assert len(body["runs"]) == 1
    runs = api(survivor.url, "GET", "/runs", params={"workflow": "deploy"}).json()["items"]
    assert len(runs) == 1
    metrics = survivor.get("/metrics").text
    assert "conveyor_events_lease_expirations_total 1.0" in metrics
