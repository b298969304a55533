"""`scaler orphans list|stop --target` forwarded over the peer channel (docs/design/scaler.md §7,
docs/design/cluster.md §7)."""

import asyncio
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster import STEADY_PEERS, Cluster, Node, peers_by_id
from tests.support.peer_client import ScriptedPeer
from tests.support.processes import run_cli
from tests.support.scaler_backends import never_registering_scalers_yaml, process_alive, stray_agent_process
from tests.support.waiting import wait_until
from tests.support.worker_cluster import SLOW_WORKFLOW, open_gate, wait_started
from tests.support.worker_cluster import start as start_worker_cluster

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("cluster-processes"), pytest.mark.timeout(300)]

STEADY = STEADY_PEERS  # forwarding, not liveness, is tested here


@pytest.fixture
def stray_home(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    """c2's home with a live agent process recorded by a node that is gone, as a crash leaves it."""
    home = tmp_path / "c2"
    with stray_agent_process(home) as pid:
        yield home, pid


def admin(node: Node, token: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(["admin", *args], env={"CONVEYOR_URL": node.url, "CONVEYOR_TOKEN": token})


def test_a_coordinator_lists_and_stops_another_node_s_orphans(
    pg_cluster: Cluster, stray_home: tuple[Path, int], tmp_path: Path
) -> None:
    home, stray_pid = stray_home
    config = never_registering_scalers_yaml(tmp_path / "scalers.yaml")
    c1 = pg_cluster.coordinator("c1", **STEADY)
    c2 = pg_cluster.coordinator("c2", CONVEYOR_SCALER_CONFIG=str(config), **STEADY)
    assert c2.home == home
    token = pg_cluster.token
    wait_until(lambda: peers_by_id(c1, token).get("c2", {}).get("connected"), what="c1 sees c2")

    listed = admin(c1, token, "scaler", "orphans", "list", "--target", "c2", "--json")
    assert listed.returncode == 0, listed.stderr
    body = json.loads(listed.stdout)
    assert body["node"] == "c2" and body["complete"] is True
    (stray,) = [i for i in body["items"] if i["agent_id"] == "stray-agent"]
    assert stray["state"] == "untracked" and stray["pid"] == stray_pid

    stopped = admin(
        c1, token, "scaler", "orphans", "stop", stray["vm_id"], "nothing-like-this", "--target", "c2"
    )
    assert stopped.returncode == 1, stopped.stderr  # the unknown id is reported, not stopped
    assert stopped.stdout.splitlines()[0].startswith(f"{stray['vm_id']}: stopped")
    assert "nothing-like-this: not_found" in stopped.stdout
    wait_until(lambda: not process_alive(stray_pid), timeout=30, what="the stray agent to end")

    missing = c1.get("/api/v1/admin/scaler/orphans?target=nobody", token)
    assert missing.status_code == 404 and missing.json()["error"] == "unknown_target"
    c2.stop()
    wait_until(lambda: peers_by_id(c1, token)["c2"]["connected"] is False, what="c2 gone")
    gone = c1.get("/api/v1/admin/scaler/orphans?target=c2", token)
    assert gone.status_code == 503 and gone.json()["error"] == "peer_not_connected"


def test_a_node_answers_orphan_requests_from_coordinators_only(pg_cluster: Cluster) -> None:
    c1 = pg_cluster.coordinator("c1")
    join = pg_cluster.join_token(c1)

    async def ask() -> dict[str, Any]:
        peer = await ScriptedPeer.connect(c1.url)
        try:
            assert (await peer.join("w-curious", join))["accepted"] is True
            await peer.send({"type": "peer.scaler.orphans.request", "message_id": "m1", "action": "list"})
            return await peer.receive_type("peer.scaler.orphans.response")
        finally:
            await peer.close()

    answer = asyncio.run(ask())
    assert answer["message_id"] == "m1" and answer["ok"] is False
    assert answer["error"] == "accepted from coordinators only"
    assert "items" not in answer


def test_a_coordinator_lists_and_stops_a_worker_s_orphans_but_refuses_an_agent_running_a_job(
    any_cluster: Cluster, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    with stray_agent_process(any_cluster.root / "w1") as stray_pid:
        stage, (coordinator,), worker = start_worker_cluster(
            any_cluster,
            tmp_path,
            SLOW_WORKFLOW.format(gate=str(gate)),
            coordinator_env=STEADY,
            worker_env=STEADY,
        )
        token = any_cluster.token
        run_id = stage.push()
        job = wait_started(stage, run_id)
        running_agent = job["agent_id"]

        listed = admin(coordinator, token, "scaler", "orphans", "list", "--target", "w1", "--json")
        assert listed.returncode == 0, listed.stderr
        body = json.loads(listed.stdout)
        assert body["node"] == "w1" and body["complete"] is True
        by_agent = {item["agent_id"]: item for item in body["items"]}
        stray = by_agent["stray-agent"]
        assert stray["state"] == "untracked" and stray["pid"] == stray_pid
        busy = by_agent[running_agent]  # the agent the worker's bare-metal scaler spawned for the job
        assert busy["state"] == "tracked" and "job" in busy["tracked_by"] and busy["job_id"] == job["id"]

        refused = admin(coordinator, token, "scaler", "orphans", "stop", busy["vm_id"], "--target", "w1")
        assert refused.returncode == 1, refused.stderr
        assert refused.stdout.startswith(f"{busy['vm_id']}: tracked")
        assert f"bound to job {job['id']}" in refused.stdout

        stopped = admin(coordinator, token, "scaler", "orphans", "stop", stray["vm_id"], "--target", "w1")
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert stopped.stdout.startswith(f"{stray['vm_id']}: stopped")
        wait_until(lambda: not process_alive(stray_pid), timeout=30, what="the stray agent to end")

        open_gate(gate)
        stage.wait_run(run_id, "success", timeout=120)  # the refused stop left the job's agent alone
    assert worker.home == any_cluster.root / "w1"
