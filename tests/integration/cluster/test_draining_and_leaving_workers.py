"""A draining worker is named in a waiting job's note; a worker that left cleanly counts as gone at once
(docs/design/cluster.md §7, §8). A real coordinator on PostgreSQL and a real worker."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.cluster import Cluster, peers_by_id
from tests.support.forget import FORGET, outcomes
from tests.support.http import HTTP
from tests.support.waiting import wait_until
from tests.support.worker_cluster import start

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("cluster-processes"), pytest.mark.timeout(300)]

DRAINING = "worker w1 matches but is draining"


def test_a_job_only_a_draining_worker_matches_says_so_and_fails_unroutable_with_it(
    pg_cluster: Cluster, tmp_path: Path
) -> None:
    # Unroutable only once the test lowers the grace, so the note is read while the job still waits.
    stage, (c1,), _ = start(pg_cluster, tmp_path, coordinator_env={"CONVEYOR_UNROUTABLE_GRACE_MS": "3600000"})
    token = pg_cluster.token
    drained = c1.post("/api/v1/admin/orchestrator/drain", token, {"action": "drain", "target": "w1"})
    assert drained.status_code == 200, drained.text
    wait_until(lambda: peers_by_id(c1, token)["w1"]["draining"], what="c1 hears w1 drains")

    run_id = stage.push()

    def build() -> dict[str, str]:
        job: dict[str, str] = next(j for j in stage.run(run_id)["jobs"] if j["name"] == "build")
        return job

    wait_until(
        lambda: build()["reason"] == f"unschedulable: {DRAINING}", timeout=60, what=f"the note {DRAINING!r}"
    )
    assert build()["status"] == "queued"
    lowered = stage.api("PATCH", "/cluster-settings", json={"unroutable_grace_ms": 0})
    assert lowered.status_code == 200, lowered.text
    failed = stage.wait_run(run_id, "failed", timeout=60)
    assert [(j["status"], j["reason"]) for j in failed["jobs"]] == [("failed", f"unroutable: {DRAINING}")]


def test_a_worker_that_left_cleanly_leaves_health_healthy_and_may_be_forgotten_at_once(
    pg_cluster: Cluster,
) -> None:
    # The liveness window of a silent peer is the default 120 s: a clean leave must not wait for it.
    c1 = pg_cluster.coordinator("c1", CONVEYOR_REROUTE_FLAP_GRACE_MS="120000")
    token = pg_cluster.token
    worker = pg_cluster.worker("w1", [c1], join_token=pg_cluster.join_token(c1))
    wait_until(lambda: c1.health(token)["status"] == "healthy", what="c1 healthy with w1 connected")

    worker.stop()  # SIGTERM: drain, flush the outbox, say `peer.leaving`
    assert worker.process.wait_exit(timeout=60) == 0
    wait_until(lambda: peers_by_id(c1, token)["w1"]["connected"] is False, what="c1 marks w1 disconnected")
    health = c1.health(token)
    assert health["status"] == "healthy", health
    assert [(p["instance_id"], p["connected"], p["left"]) for p in health["peers"]] == [("w1", False, True)]
    assert peers_by_id(c1, token)["w1"]["left"] is True

    answer = HTTP.post(
        c1.url + FORGET, json={"instance_id": "w1"}, headers={"Authorization": f"Bearer {token}"}, timeout=30
    )
    assert answer.status_code == 200, answer.text
    assert outcomes(answer) == [("c1", "forgotten")]
    assert "w1" not in peers_by_id(c1, token)
    after = c1.health(token)
    assert (after["status"], after["peers"]) == ("healthy", [])
