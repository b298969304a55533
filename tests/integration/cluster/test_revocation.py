"""Revocation kicks live sessions on every coordinator (docs/design/cluster.md §2.2, scenario 6)."""

import time

import pytest

from tests.support.cluster import Cluster, peers_by_id
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("cluster-processes"), pytest.mark.timeout(300)]

# Both sessions must close within 1 s of the revoke; the polls of two admin APIs need a little room.
KICK_BOUND_S = 1.0
POLL_SLACK_S = 0.5


def test_revoking_a_worker_closes_its_sessions_on_both_coordinators_with_4403_and_refuses_it_after(
    pg_cluster: Cluster,
) -> None:
    c1 = pg_cluster.coordinator("c1")
    c2 = pg_cluster.coordinator("c2")
    wait_until(lambda: peers_by_id(c1, pg_cluster.token).get("c2", {}).get("connected"), what="c1 sees c2")
    wait_until(lambda: peers_by_id(c2, pg_cluster.token).get("c1", {}).get("connected"), what="c2 sees c1")
    worker = pg_cluster.worker("w1", [c1, c2], join_token=pg_cluster.join_token(c1))
    for node in (c1, c2):
        wait_until(
            lambda n=node: peers_by_id(n, pg_cluster.token).get("w1", {}).get("connected"), what="w1 on both"
        )

    began = time.monotonic()
    answer = c2.post("/api/v1/admin/peers/w1/revoke", pg_cluster.token)
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"instance_id": "w1", "revoked_credentials": 1, "sessions_closed": 1}
    for node in (c1, c2):
        wait_until(
            lambda n=node: peers_by_id(n, pg_cluster.token)["w1"]["connected"] is False,
            timeout=KICK_BOUND_S + POLL_SLACK_S,
            what=f"{node.name} closes w1's session",
        )
    assert time.monotonic() - began <= KICK_BOUND_S + POLL_SLACK_S
    wait_until(
        lambda: worker.output().count("disconnected (close 4403)") >= 2, what="w1 sees both 4403 closes"
    )
    assert "peer c1 disconnected (close 4403)" in worker.output()
    assert "peer c2 disconnected (close 4403)" in worker.output()

    wait_until(
        lambda: "credential_revoked (close 4401)" in worker.output(), timeout=30, what="reconnect refused"
    )
    listed = peers_by_id(c1, pg_cluster.token)["w1"]
    assert listed["credential_revoked_at"] is not None and listed["connected"] is False


def test_revoking_an_unknown_peer_is_404(pg_cluster: Cluster) -> None:
    c1 = pg_cluster.coordinator("c1")
    answer = c1.post("/api/v1/admin/peers/nobody/revoke", pg_cluster.token)
    assert answer.status_code == 404 and answer.json()["error"] == "not_found"
