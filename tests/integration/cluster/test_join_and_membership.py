"""Workers join coordinators over `/ws/peer` (docs/design/cluster.md §2.2, scenarios 4 and 15, membership)."""

import stat
import time

import pytest
from sqlalchemy import text

from conveyor.db.engine import create_sync_engine
from tests.support.cluster import Cluster, peers_by_id
from tests.support.http import HTTP
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("cluster-processes"), pytest.mark.timeout(300)]

HEARTBEAT_S = 0.2
STALE_BEATS = 3
# Stale after 3 missed beats, checked every half interval.
STALE_BOUND_S = HEARTBEAT_S * STALE_BEATS + HEARTBEAT_S / 2
# Room for process scheduling and the admin API polls on a busy 2-core box.
SCHEDULING_SLACK_S = 1.5


def test_a_join_token_admits_one_worker_which_saves_its_credential_0600(pg_cluster: Cluster) -> None:
    c1 = pg_cluster.coordinator("c1")
    token = pg_cluster.join_token(c1)
    a = pg_cluster.worker("wa", [c1], join_token=token)
    credential = a.home / "peer-credential.json"
    assert stat.S_IMODE(credential.stat().st_mode) == 0o600
    wait_until(lambda: peers_by_id(c1, pg_cluster.token).get("wa", {}).get("connected"), what="wa connected")
    assert peers_by_id(c1, pg_cluster.token)["wa"]["role"] == "worker"

    b = pg_cluster.worker("wb", [c1], join_token=token, wait=False)
    wait_until(lambda: "token_used" in b.output(), what="wb refused with token_used")
    assert "token_used (close 4401)" in b.output()
    assert b.get("/ready").status_code == 503
    assert not (b.home / "peer-credential.json").exists()


def test_an_expired_join_token_is_refused_with_token_expired(pg_cluster: Cluster) -> None:
    c1 = pg_cluster.coordinator("c1")
    token = pg_cluster.join_token(c1, expires_in_ms=60_000)
    engine = create_sync_engine(pg_cluster.database_url or "")
    try:
        with engine.begin() as conn:  # a minute is the shortest lifetime: age the row instead of waiting
            conn.execute(text("UPDATE join_tokens SET expires_at = now() - interval '1 second'"))
    finally:
        engine.dispose()
    worker = pg_cluster.worker("wx", [c1], join_token=token, wait=False)
    wait_until(lambda: "token_expired (close 4401)" in worker.output(), what="wx refused with token_expired")


def test_a_worker_on_two_coordinators_is_listed_on_both_goes_stale_when_frozen_and_returns_when_thawed(
    pg_cluster: Cluster,
) -> None:
    c1 = pg_cluster.coordinator("c1")
    c2 = pg_cluster.coordinator("c2")
    # The lower id dials the higher one: the two coordinators see each other connected.
    wait_until(lambda: peers_by_id(c1, pg_cluster.token).get("c2", {}).get("connected"), what="c1 sees c2")
    wait_until(lambda: peers_by_id(c2, pg_cluster.token).get("c1", {}).get("connected"), what="c2 sees c1")
    assert peers_by_id(c2, pg_cluster.token)["c1"]["role"] == "coordinator"

    worker = pg_cluster.worker("w1", [c1, c2], join_token=pg_cluster.join_token(c1))
    for node in (c1, c2):
        wait_until(
            lambda n=node: peers_by_id(n, pg_cluster.token).get("w1", {}).get("connected"), what="w1 listed"
        )
        entry = peers_by_id(node, pg_cluster.token)["w1"]
        assert entry["role"] == "worker" and entry["credential_expires_at"] is not None
    saved = (worker.home / "peer-credential.json").read_bytes()
    ready = worker.get("/ready").json()
    assert ready["checks"]["coordinator"]["detail"].startswith("2 of 2")
    assert ready["checks"]["jobs"]["detail"].startswith("runs rerouted jobs: 0 held")

    worker.freeze()
    frozen_at = time.monotonic()
    for node in (c1, c2):
        wait_until(
            lambda n=node: peers_by_id(n, pg_cluster.token)["w1"]["connected"] is False,
            timeout=STALE_BOUND_S + SCHEDULING_SLACK_S,
            what=f"{node.name} marks the frozen worker disconnected",
        )
    assert time.monotonic() - frozen_at <= STALE_BOUND_S + SCHEDULING_SLACK_S

    worker.thaw()
    for node in (c1, c2):
        wait_until(
            lambda n=node: peers_by_id(n, pg_cluster.token)["w1"]["connected"], timeout=30, what="w1 back"
        )
    # Reconnected with the saved credential: the file is unchanged and no token was needed again.
    assert (worker.home / "peer-credential.json").read_bytes() == saved
    assert worker.output().count("credential saved") == 1


def test_a_sqlite_coordinator_accepts_a_worker_and_tells_anonymous_callers_only_the_status(
    any_cluster: Cluster,
) -> None:
    c1 = any_cluster.coordinator("c1")
    worker = any_cluster.worker("w1", [c1], join_token=any_cluster.join_token(c1))
    wait_until(lambda: peers_by_id(c1, any_cluster.token).get("w1", {}).get("connected"), what="w1 connected")
    anonymous = c1.get("/cluster/health")
    assert anonymous.status_code == 200 and anonymous.json() == {"status": "healthy"}
    detailed = c1.health(any_cluster.token)
    assert detailed["instance_id"] == "c1" and detailed["role"] == "coordinator"
    assert detailed["lease"]["holder"] == "c1"
    assert [(p["instance_id"], p["role"], p["connected"]) for p in detailed["peers"]] == [
        ("w1", "worker", True)
    ]
    assert worker.health() == {"status": "healthy"}
    # A worker serves no admin API and accepts no peers.
    assert worker.get("/api/v1/admin/peers", any_cluster.token).status_code == 404
    upgrade = {
        "Connection": "Upgrade",
        "Upgrade": "websocket",
        "Sec-WebSocket-Version": "13",
        "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
    }
    refused = HTTP.get(worker.url + "/ws/peer", headers=upgrade, timeout=10)
    assert refused.status_code == 404 and refused.json()["error"] == "not_found"


def test_a_worker_that_stops_cleanly_is_marked_disconnected_at_once_by_peer_leaving(
    pg_cluster: Cluster,
) -> None:
    c1 = pg_cluster.coordinator("c1", CONVEYOR_CLUSTER_PEER_STALE_BEATS="100")  # staleness would take 20 s
    worker = pg_cluster.worker("w1", [c1], join_token=pg_cluster.join_token(c1))
    wait_until(lambda: peers_by_id(c1, pg_cluster.token).get("w1", {}).get("connected"), what="w1 connected")
    worker.stop()
    assert worker.process.proc.returncode == 0
    wait_until(
        lambda: peers_by_id(c1, pg_cluster.token)["w1"]["connected"] is False,
        timeout=5,
        what="c1 marks w1 disconnected on peer.leaving",
    )
    assert "peer w1 is leaving" in c1.output()
