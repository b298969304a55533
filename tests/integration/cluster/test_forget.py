"""`peer forget` against real coordinators (docs/design/cluster.md §7, scenarios 12 and 13)."""

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import text

from conveyor.db.engine import create_sync_engine
from tests.support.cluster import Cluster, Node, peers_by_id
from tests.support.forget import FORGET, outcomes
from tests.support.http import HTTP
from tests.support.peer_client import ScriptedPeer
from tests.support.processes import run_cli
from tests.support.scaler_backends import never_registering_scalers_yaml
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("cluster-processes"), pytest.mark.timeout(300)]


def set_flap_grace(node: Node, token: str, ms: int) -> None:
    """The liveness window's knob (the stale window is 600 ms in tests, so the grace decides)."""
    answer = HTTP.patch(
        node.url + "/api/v1/admin/cluster-settings",
        json={"reroute_flap_grace_ms": ms},
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    )
    assert answer.status_code == 200, answer.text


def wait_in_sync(node: Node, token: str, instances: set[str]) -> None:
    """Until `instances` serve the newest cluster settings: each coordinator checks its own window."""

    def in_sync() -> bool:
        answer = node.get("/api/v1/admin/cluster-settings/propagation", token)
        assert answer.status_code == 200, answer.text
        report = answer.json()["orchestrators"]
        return instances <= {e["instance_id"] for e in report if e["status"] == "in-sync"}

    wait_until(in_sync, timeout=30, what=f"{sorted(instances)} to serve the new settings")


def forget(node: Node, token: str, instance_id: str, **extra: Any) -> httpx.Response:
    return node.post(FORGET, token, {"instance_id": instance_id, **extra})


def instance_rows(database_url: str) -> set[str]:
    engine = create_sync_engine(database_url)
    try:
        with engine.connect() as conn:
            return {row[0] for row in conn.execute(text("SELECT instance_id FROM cluster_instances"))}
    finally:
        engine.dispose()


def test_forget_refuses_self_and_connected_and_a_recent_peer_then_forgets_it_on_every_coordinator(
    pg_cluster: Cluster,
) -> None:
    c1 = pg_cluster.coordinator("c1")
    c2 = pg_cluster.coordinator("c2")
    token = pg_cluster.token
    wait_until(lambda: peers_by_id(c1, token).get("c2", {}).get("connected"), what="c1 sees c2")
    worker = pg_cluster.worker("w1", [c1, c2], join_token=pg_cluster.join_token(c1))
    for node in (c1, c2):
        wait_until(lambda n=node: peers_by_id(n, token).get("w1", {}).get("connected"), what="w1 listed")
    set_flap_grace(c1, token, 60_000)

    assert outcomes(forget(c1, token, "c1")) == [("c1", "self")]
    assert outcomes(forget(c1, token, "w1")) == [("c1", "connected")]

    worker.kill9()  # silent, not a clean leave (that counts as gone at once): the window applies
    for node in (c1, c2):
        wait_until(lambda n=node: peers_by_id(n, token)["w1"]["connected"] is False, what="w1 gone")
    recent = forget(c1, token, "w1")
    assert recent.status_code == 200
    # A local refusal stops the fan-out: c2 is not asked.
    assert outcomes(recent) == [("c1", "within-liveness-window")]
    assert recent.json()["results"][0]["detail"].startswith("reroute-grace:")
    assert "w1" in peers_by_id(c2, token)

    set_flap_grace(c1, token, 1_000)  # the window now ends a second after w1's last beat
    wait_in_sync(c1, token, {"c1", "c2"})

    def forgotten() -> httpx.Response | None:
        answer = forget(c1, token, "w1")
        return answer if outcomes(answer)[0][1] != "within-liveness-window" else None

    done = wait_until(forgotten, timeout=30, what="the window to pass")
    assert done.status_code == 200
    assert outcomes(done) == [("c1", "forgotten"), ("c2", "forgotten")]
    for node in (c1, c2):
        assert "w1" not in peers_by_id(node, token)
        peers = node.health(token)["peers"]
        assert [p["instance_id"] for p in peers] == [("c2" if node is c1 else "c1")]
    # Retrying is safe: nobody knows it any more.
    assert outcomes(forget(c1, token, "w1")) == [("c1", "not-known"), ("c2", "not-known")]


def test_forgetting_the_last_sibling_of_a_coordinator_with_a_scaler_needs_an_acknowledgement(
    pg_cluster: Cluster, tmp_path: Path
) -> None:
    config = never_registering_scalers_yaml(tmp_path / "scalers.yaml")
    c1 = pg_cluster.coordinator("c1", CONVEYOR_SCALER_CONFIG=str(config))
    c2 = pg_cluster.coordinator("c2")
    token = pg_cluster.token
    wait_until(lambda: peers_by_id(c1, token).get("c2", {}).get("connected"), what="c1 sees c2")
    set_flap_grace(c1, token, 1_000)
    c2.kill9()  # its row stays behind: only a clean shutdown deletes it
    assert "c2" in instance_rows(pg_cluster.database_url or "")

    def refused() -> httpx.Response | None:
        answer = forget(c1, token, "c2")
        return answer if answer.status_code == 409 else None

    refusal = wait_until(refused, timeout=30, what="c2's window to pass")
    body = refusal.json()
    assert body["error"] == "acknowledgement_required" and body["acknowledgement_required"] is True
    assert body["instance_id"] == "c2"
    assert outcomes(refusal) == [("c1", "backstop-acknowledgement-required")]
    assert "c2" in peers_by_id(c1, token)

    env = {"CONVEYOR_URL": c1.url, "CONVEYOR_TOKEN": token}
    no_tty = run_cli(["admin", "peer", "forget", "c2"], env=env)
    assert no_tty.returncode == 2 and "--acknowledge-backstop" in no_tty.stderr
    assert "Traceback" not in no_tty.stderr

    acknowledged = run_cli(["admin", "peer", "forget", "c2", "--acknowledge-backstop", "--json"], env=env)
    assert acknowledged.returncode == 0, acknowledged.stderr
    assert [(r["coordinator"], r["outcome"]) for r in json.loads(acknowledged.stdout)["results"]] == [
        ("c1", "forgotten")
    ]
    assert "c2" not in peers_by_id(c1, token)
    # The row is gone, so the discovery loop does not bring the dead coordinator back.
    assert "c2" not in instance_rows(pg_cluster.database_url or "")
    assert c1.health(token)["status"] == "healthy"


def test_forget_checks_its_body_and_is_refused_to_a_reader(any_cluster: Cluster) -> None:
    c1 = any_cluster.coordinator("c1")
    token = any_cluster.token
    for body in (
        {},
        {"instance_id": ""},
        {"instance_id": "w1", "timeout_ms": 50},
        {"instance_id": "w1", "timeout_ms": "500"},
        {"instance_id": "w1", "surprise": True},
    ):
        answer = c1.post(FORGET, token, body)
        assert answer.status_code == 400, (body, answer.text)
        assert answer.json()["error"] == "invalid_request"
    auditor = c1.post("/api/v1/admin/tokens", token, {"label": "a", "role": "auditor"}).json()["token"]
    assert forget(c1, auditor, "w1").status_code == 403
    env = {"CONVEYOR_URL": c1.url, "CONVEYOR_TOKEN": token}
    unknown = run_cli(["admin", "peer", "forget", "nobody"], env=env)
    assert unknown.returncode == 0 and "not-known" in unknown.stdout


def test_a_forget_request_from_a_worker_credential_gets_error(pg_cluster: Cluster) -> None:
    c1 = pg_cluster.coordinator("c1")
    join = pg_cluster.join_token(c1)

    async def ask() -> dict[str, Any]:
        peer = await ScriptedPeer.connect(c1.url)
        try:
            assert (await peer.join("w-impostor", join))["accepted"] is True
            await peer.send(
                {
                    "type": "peer.forget.request",
                    "message_id": "m1",
                    "instance_id": "c1",
                    "acknowledge_backstop": True,
                }
            )
            return await peer.receive_type("peer.forget.response")
        finally:
            await peer.close()

    answer = asyncio.run(ask())
    assert answer["message_id"] == "m1" and answer["outcome"] == "error"
    assert answer["detail"] == "only coordinators may send forget requests"
