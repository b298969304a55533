"""`scaler reload --target NODE|all` forwarded over the peer channel (docs/design/scaler.md §3.1): two
coordinators on one PostgreSQL database and a database-less worker, each with its own `scalers.yaml`."""

import asyncio
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster import STEADY_PEERS, Cluster, Node, peers_by_id
from tests.support.peer_client import ScriptedPeer
from tests.support.processes import run_cli
from tests.support.scaler_backends import never_registering_scalers_yaml
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("cluster-processes"), pytest.mark.timeout(300)]


def admin(node: Node, token: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(["admin", *args], env={"CONVEYOR_URL": node.url, "CONVEYOR_TOKEN": token})


def reload(node: Node, token: str, target: str, *extra: str) -> tuple[int, dict[str, Any]]:
    """`scaler reload --target … --json`: the exit code and each node's result by instance id."""
    answer = admin(node, token, "scaler", "reload", "--target", target, "--json", *extra)
    assert answer.returncode in (0, 1), answer.stdout + answer.stderr
    body = json.loads(answer.stdout)
    return answer.returncode, {result["node"]: result for result in body["results"]}


def bad_scalers_yaml(path: Path) -> None:
    """A `scalers.yaml` whose only scaler has a `max_agents` that is not a number."""
    config = json.loads(path.read_text())
    config["scalers"][0]["max_agents"] = "lots"
    path.write_text(json.dumps(config))


def start(cluster: Cluster, tmp_path: Path) -> tuple[Node, Node, Node, Path]:
    """c1 and c2 on the cluster's database, worker w1 joined to both; each runs a scaler from its own file."""
    configs = {
        name: never_registering_scalers_yaml(tmp_path / f"{name}-scalers.yaml") for name in ("c1", "c2", "w1")
    }
    c1 = cluster.coordinator("c1", CONVEYOR_SCALER_CONFIG=str(configs["c1"]), **STEADY_PEERS)
    c2 = cluster.coordinator("c2", CONVEYOR_SCALER_CONFIG=str(configs["c2"]), **STEADY_PEERS)
    join = cluster.join_token(c1)
    w1 = cluster.worker(
        "w1", [c1, c2], join_token=join, CONVEYOR_SCALER_CONFIG=str(configs["w1"]), **STEADY_PEERS
    )
    token = cluster.token
    wait_until(
        lambda: {"c2", "w1"} <= {i for i, p in peers_by_id(c1, token).items() if p["connected"]},
        what="c1 connected to c2 and w1",
    )
    return c1, c2, w1, configs["w1"]


def test_reload_reaches_each_node_then_all_of_them_with_a_refusal_and_an_unreachable_one(
    pg_cluster: Cluster, tmp_path: Path
) -> None:
    c1, c2, w1, w1_config = start(pg_cluster, tmp_path)
    token = pg_cluster.token

    for target, role in (("c1", "coordinator"), ("c2", "coordinator"), ("w1", "worker")):
        code, results = reload(c1, token, target)
        assert code == 0 and list(results) == [target], results
        assert results[target]["outcome"] == "reloaded" and results[target]["role"] == role
        assert results[target]["scalers"] == ["local"]
    assert "scaler reload asked by c1: reloaded" in w1.output()

    bad_scalers_yaml(w1_config)
    code, results = reload(c1, token, "all")
    assert code == 1 and list(results) == ["c1", "c2", "w1"], results
    assert results["c1"]["outcome"] == "reloaded" and results["c2"]["outcome"] == "reloaded"
    refused = results["w1"]
    assert refused["outcome"] == "refused" and "max_agents" in refused["detail"], refused
    assert refused["detail"].endswith("the running configuration was kept")
    status = admin(c1, token, "scaler", "status", "--json")  # c1's own scaler, untouched by w1's refusal
    assert json.loads(status.stdout)["scalers"][0]["name"] == "local"

    text = admin(c1, token, "scaler", "reload", "--target", "w1")
    assert text.returncode == 1 and text.stdout.startswith("w1 (worker): refused ("), text.stdout

    c2.stop()
    wait_until(lambda: peers_by_id(c1, token)["c2"]["connected"] is False, what="c1 sees c2 gone")
    w1.freeze()  # its session stays open, but it answers nothing
    code, results = reload(c1, token, "all", "--timeout-ms", "1000")
    assert code == 1 and list(results) == ["c1", "c2", "w1"], results
    assert results["c1"]["outcome"] == "reloaded"
    assert results["c2"] == {
        "node": "c2",
        "role": "coordinator",
        "outcome": "unreachable",
        "detail": "not connected to c1",
    }
    assert results["w1"]["outcome"] == "unreachable" and results["w1"]["detail"] == "no answer within 1 s"
    w1.thaw()

    unknown = c1.post("/api/v1/admin/scaler/reload", token, {"target": "nobody"})
    assert unknown.status_code == 404 and unknown.json()["error"] == "unknown_target"
    local = c1.post("/api/v1/admin/scaler/reload", token)  # no target: this node, as before
    assert local.status_code == 200 and local.json() == {"applied": True, "scalers": ["local"]}


def test_a_node_answers_reload_requests_from_coordinators_only(pg_cluster: Cluster) -> None:
    c1 = pg_cluster.coordinator("c1")
    join = pg_cluster.join_token(c1)

    async def ask() -> dict[str, Any]:
        peer = await ScriptedPeer.connect(c1.url)
        try:
            assert (await peer.join("w-curious", join))["accepted"] is True
            await peer.send({"type": "peer.scaler.reload.request", "message_id": "m1"})
            return await peer.receive_type("peer.scaler.reload.response")
        finally:
            await peer.close()

    answer = asyncio.run(ask())
    assert answer["message_id"] == "m1" and answer["node"] == "c1"
    assert answer["outcome"] == "refused" and answer["detail"] == "accepted from coordinators only"
    assert "reload asked" not in c1.output()
