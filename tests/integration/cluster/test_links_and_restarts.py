"""Links cut and nodes restarted or killed (docs/design/cluster.md §2.3, §8, §9 controls)."""

import pytest

from tests.support.cluster import Cluster, peers_by_id
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("cluster-processes"), pytest.mark.timeout(300)]


def test_a_cut_link_disconnects_one_coordinator_and_the_worker_redials_when_it_is_restored(
    pg_cluster: Cluster,
) -> None:
    c1 = pg_cluster.coordinator("c1")
    c2 = pg_cluster.coordinator("c2")
    worker = pg_cluster.worker("w1", [c1, c2], join_token=pg_cluster.join_token(c1), via_proxy=True)
    for node in (c1, c2):
        wait_until(
            lambda n=node: peers_by_id(n, pg_cluster.token).get("w1", {}).get("connected"), what="w1 on both"
        )
    wait_until(lambda: worker.health() == {"status": "healthy"}, what="worker healthy")

    pg_cluster.cut_link(worker, c1)
    wait_until(lambda: peers_by_id(c1, pg_cluster.token)["w1"]["connected"] is False, what="c1 loses w1")
    assert peers_by_id(c2, pg_cluster.token)["w1"]["connected"] is True
    wait_until(lambda: worker.health() == {"status": "degraded"}, what="worker degraded")
    assert worker.get("/ready").status_code == 200  # one coordinator is enough to be ready

    pg_cluster.restore_link(worker, c1)
    wait_until(lambda: peers_by_id(c1, pg_cluster.token)["w1"]["connected"], timeout=30, what="w1 redials c1")
    wait_until(lambda: worker.health() == {"status": "healthy"}, what="worker healthy again")


def test_a_restarted_worker_rejoins_with_its_saved_credential_alone(pg_cluster: Cluster) -> None:
    c1 = pg_cluster.coordinator("c1")
    token = pg_cluster.join_token(c1)
    worker = pg_cluster.worker("w1", [c1], join_token=token)
    wait_until(lambda: peers_by_id(c1, pg_cluster.token).get("w1", {}).get("connected"), what="w1 joined")
    worker.env.pop("CONVEYOR_CLUSTER_JOIN_TOKEN")  # the token is spent; the credential file must do
    worker.restart()
    worker.wait_ready()
    wait_until(lambda: peers_by_id(c1, pg_cluster.token)["w1"]["connected"], what="w1 back")
    assert "credential saved" not in worker.output()


def test_a_killed_sibling_stays_known_and_disconnected_so_health_is_degraded(pg_cluster: Cluster) -> None:
    c1 = pg_cluster.coordinator("c1")
    c2 = pg_cluster.coordinator("c2")
    wait_until(lambda: peers_by_id(c1, pg_cluster.token).get("c2", {}).get("connected"), what="c1 sees c2")
    wait_until(lambda: c1.health() == {"status": "healthy"}, what="c1 healthy")
    c2.kill9()
    wait_until(lambda: peers_by_id(c1, pg_cluster.token)["c2"]["connected"] is False, what="c1 loses c2")
    wait_until(lambda: c1.health() == {"status": "degraded"}, what="c1 degraded")
    detail = c1.health(pg_cluster.token)
    assert [(p["instance_id"], p["connected"]) for p in detail["peers"]] == [("c2", False)]
    # A restarted coordinator seeds its registry from the rows: the dead sibling is still known.
    c1.restart()
    c1.wait_ready()
    assert c1.health(pg_cluster.token)["peers"][0]["instance_id"] == "c2"
