"""Drain and shutdown (docs/design/cluster.md §8, scenario 14): worker routes, drain through a coordinator,
the CLI, SIGTERM."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.support.cluster import Cluster, Node, peers_by_id
from tests.support.http import HTTP
from tests.support.processes import admin_ok, run_cli
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("cluster-processes"), pytest.mark.timeout(300)]

WORKER_ADMIN_TOKEN = "worker-admin-" + "ab" * 16


def post(node: Node, path: str, token: str | None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    return HTTP.post(node.url + path, headers=headers, timeout=10)


def admin(node: Node, token: str, *args: str) -> Any:
    return admin_ok(node.url, token, *args)


def test_a_worker_drains_through_its_own_routes_only_with_its_admin_token(pg_cluster: Cluster) -> None:
    c1 = pg_cluster.coordinator("c1")
    worker = pg_cluster.worker(
        "w1", [c1], join_token=pg_cluster.join_token(c1), CONVEYOR_WORKER_ADMIN_TOKEN=WORKER_ADMIN_TOKEN
    )
    for token in (None, "wrong", pg_cluster.token):
        refused = post(worker, "/drain", token)
        assert refused.status_code == 401 and refused.json()["error"] == "unauthenticated", token
    assert worker.get("/ready").json()["draining"] is False

    drained = post(worker, "/drain", WORKER_ADMIN_TOKEN)
    assert drained.status_code == 200
    assert drained.json() == {"instance_id": "w1", "draining": True, "jobs_running": 0}
    assert worker.get("/ready").json()["draining"] is True
    wait_until(lambda: peers_by_id(c1, pg_cluster.token)["w1"]["draining"], what="c1 hears w1 drains")

    resumed = post(worker, "/resume", WORKER_ADMIN_TOKEN)
    assert resumed.status_code == 200 and resumed.json()["draining"] is False
    wait_until(lambda: not peers_by_id(c1, pg_cluster.token)["w1"]["draining"], what="c1 hears w1 resumed")


def test_without_an_admin_token_a_worker_serves_no_drain_route(pg_cluster: Cluster) -> None:
    c1 = pg_cluster.coordinator("c1")
    worker = pg_cluster.worker("w1", [c1], join_token=pg_cluster.join_token(c1))
    for path in ("/drain", "/resume"):
        answer = post(worker, path, "anything")
        assert answer.status_code == 404 and answer.json()["error"] == "not_found"
    assert worker.get("/ready").json()["draining"] is False


def test_the_cli_drains_and_resumes_a_worker_through_a_coordinator(pg_cluster: Cluster) -> None:
    c1 = pg_cluster.coordinator("c1")
    token = pg_cluster.token
    worker = pg_cluster.worker("w1", [c1], join_token=pg_cluster.join_token(c1))
    wait_until(lambda: peers_by_id(c1, token).get("w1", {}).get("connected"), what="w1 connected")

    drained = admin(c1, token, "orchestrator", "drain", "--target", "w1", "--wait", "--json")
    assert drained == {"instance_id": "w1", "draining": True, "jobs_running": 0}
    assert worker.get("/ready").json()["draining"] is True
    wait_until(lambda: peers_by_id(c1, token)["w1"]["draining"], what="peer list shows w1 draining")
    assert [p["draining"] for p in c1.health(token)["peers"] if p["instance_id"] == "w1"] == [True]
    listed = admin(c1, token, "peer", "list")
    assert any(line.split()[:4] == ["w1", "worker", "yes", "yes"] for line in listed.splitlines())
    status = admin(c1, token, "orchestrator", "status", "--target", "w1")
    assert ["draining", "yes"] in [line.split() for line in status.splitlines()]
    assert admin(c1, token, "orchestrator", "status", "--target", "w1", "--json")["draining"] is True

    resumed = admin(c1, token, "orchestrator", "resume", "--target", "w1", "--json")
    assert resumed["draining"] is False
    assert worker.get("/ready").json()["draining"] is False
    wait_until(lambda: not peers_by_id(c1, token)["w1"]["draining"], what="peer list shows w1 resumed")
    # Draining a worker leaves the coordinator alone.
    assert admin(c1, token, "orchestrator", "status", "--json") == {
        "instance_id": "c1",
        "draining": False,
        "jobs_running": 0,
    }


def test_a_coordinator_drains_itself_and_says_so_in_ready_and_its_instance_row(pg_cluster: Cluster) -> None:
    c1 = pg_cluster.coordinator("c1")
    token = pg_cluster.token
    assert admin(c1, token, "orchestrator", "drain", "--json")["draining"] is True
    assert c1.get("/ready").json()["draining"] is True

    def row_draining() -> bool:
        status = c1.get("/api/v1/admin/cluster/status", token).json()
        return bool([i["draining"] for i in status["instances"] if i["instance_id"] == "c1"] == [True])

    wait_until(row_draining, what="c1's cluster_instances row says draining")
    assert admin(c1, token, "orchestrator", "resume", "--json")["draining"] is False
    assert c1.get("/ready").json()["draining"] is False


def test_the_drain_cli_refuses_a_bad_target_and_a_token_without_the_permission(pg_cluster: Cluster) -> None:
    c1 = pg_cluster.coordinator("c1")
    token = pg_cluster.token
    base = ["admin", "--url", c1.url]
    unknown = run_cli([*base, "--token", token, "orchestrator", "drain", "--target", "nobody"])
    assert unknown.returncode == 4
    assert "unknown_target, HTTP 404" in unknown.stderr and "Traceback" not in unknown.stderr
    made = c1.post("/api/v1/admin/tokens", token, {"role": "auditor", "label": "audit"})
    assert made.status_code == 201, made.text
    auditor = made.json()["token"]
    refused = run_cli([*base, "--token", auditor, "orchestrator", "drain"])
    assert refused.returncode == 3
    assert "orchestrator.drain" in refused.stderr and "forbidden, HTTP 403" in refused.stderr
    assert "Traceback" not in refused.stderr
    # The auditor may read the drain state (peer.read), and nothing was drained.
    shown = run_cli([*base, "--token", auditor, "orchestrator", "status", "--json"])
    assert shown.returncode == 0 and json.loads(shown.stdout)["draining"] is False


def test_a_disconnected_worker_cannot_be_drained_and_says_why(pg_cluster: Cluster) -> None:
    c1 = pg_cluster.coordinator("c1", CONVEYOR_CLUSTER_PEER_STALE_BEATS="100")
    token = pg_cluster.token
    worker = pg_cluster.worker("w1", [c1], join_token=pg_cluster.join_token(c1))
    wait_until(lambda: peers_by_id(c1, token).get("w1", {}).get("connected"), what="w1 connected")
    worker.stop()
    wait_until(lambda: not peers_by_id(c1, token)["w1"]["connected"], what="w1 left")
    refused = c1.post("/api/v1/admin/orchestrator/drain", token, {"action": "drain", "target": "w1"})
    assert refused.status_code == 503 and refused.json()["error"] == "peer_not_connected"


def test_a_worker_that_does_not_answer_a_drain_request_in_15_s_gets_504(pg_cluster: Cluster) -> None:
    c1 = pg_cluster.coordinator("c1", CONVEYOR_CLUSTER_PEER_STALE_BEATS="200")  # stays connected for 40 s
    token = pg_cluster.token
    worker = pg_cluster.worker("w1", [c1], join_token=pg_cluster.join_token(c1))
    wait_until(lambda: peers_by_id(c1, token).get("w1", {}).get("connected"), what="w1 connected")
    worker.freeze()
    try:
        answer = HTTP.post(
            c1.url + "/api/v1/admin/orchestrator/drain",
            json={"action": "drain", "target": "w1"},
            headers={"Authorization": f"Bearer {token}"},
            timeout=30,
        )
    finally:
        worker.thaw()
    assert answer.status_code == 504 and answer.json()["error"] == "peer_timeout"
    assert "15 s" in answer.json()["detail"]


def test_sigterm_with_nothing_running_drains_says_leaving_and_exits_0(pg_cluster: Cluster) -> None:
    c1 = pg_cluster.coordinator("c1", CONVEYOR_CLUSTER_PEER_STALE_BEATS="100")  # staleness would take 20 s
    token = pg_cluster.token
    worker = pg_cluster.worker("w1", [c1], join_token=pg_cluster.join_token(c1))
    wait_until(lambda: peers_by_id(c1, token).get("w1", {}).get("connected"), what="w1 connected")
    worker.stop()
    assert worker.process.proc.returncode == 0
    wait_until(
        lambda: peers_by_id(c1, token)["w1"]["connected"] is False,
        timeout=5,
        what="c1 marks w1 disconnected on peer.leaving",
    )
    output = worker.output()
    assert "draining: this node takes no new work (shutdown)" in output
    assert "peer w1 is leaving" in c1.output()
