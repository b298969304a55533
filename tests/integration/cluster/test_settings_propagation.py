"""Workers pull cluster-settings snapshots and the propagation report follows them
(docs/design/cluster.md §5.3, scenario 11)."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from sqlalchemy import text

from conveyor.db.engine import create_sync_engine
from tests.support.cluster import Cluster, Node
from tests.support.http import HTTP
from tests.support.processes import run_cli
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("cluster-processes"), pytest.mark.timeout(300)]

# Slower beats than docs/design/cluster.md §9's 200 ms: the `ahead` state lasts about three coordinator beats,
# and the test must see it by polling the report on a busy 2-core box.
HEARTBEAT_MS = 500
BEATS = {"CONVEYOR_CLUSTER_HEARTBEAT_INTERVAL_MS": str(HEARTBEAT_MS)}
# "Within two heartbeats" of the PATCH (the writer drops its cache, so its next beat advertises the new
# version; the worker pulls at once and advertises it at its next beat), plus room for scheduling.
IN_SYNC_BOUND_S = 2 * HEARTBEAT_MS / 1000 + 1.5
TTL_MS = 7_200_000


def propagation(node: Node, token: str) -> dict[str, Any]:
    answer = node.get("/api/v1/admin/cluster-settings/propagation", token)
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


def statuses(node: Node, token: str) -> dict[str, tuple[int, str]]:
    return {
        e["instance_id"]: (e["applied_version"], e["status"])
        for e in propagation(node, token)["orchestrators"]
    }


def applied_ttl(worker: Node) -> tuple[int, int]:
    """(version, agent_token_ttl_ms) of the snapshot the worker holds, from its `/ready` settings check."""
    check = worker.get("/ready").json()["checks"]["settings"]
    return check["version"], check["values"]["agent_token_ttl_ms"]


def lower_row_version(cluster: Cluster, coordinator: Node, version: int) -> None:
    """What a database restore does: the row's version (and its values) go back."""
    url = cluster.database_url or f"sqlite:///{coordinator.home / 'conveyor.db'}"
    engine = create_sync_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(
                text("UPDATE cluster_settings SET version = :v, agent_token_ttl_ms = NULL"), {"v": version}
            )
    finally:
        engine.dispose()


def test_two_workers_apply_a_change_within_two_beats_and_self_heal_after_a_restore(
    pg_cluster: Cluster,
) -> None:
    c1 = pg_cluster.coordinator("c1", **BEATS)
    token = pg_cluster.token
    workers = [
        pg_cluster.worker(name, [c1], join_token=pg_cluster.join_token(c1), **BEATS) for name in ("w1", "w2")
    ]
    wait_until(lambda: {"w1", "w2"} <= set(statuses(c1, token)), what="both workers in the report")
    assert all(applied_ttl(w)[1] == 3_600_000 for w in workers)

    answer = HTTP.patch(
        c1.url + "/api/v1/admin/cluster-settings",
        json={"agent_token_ttl_ms": TTL_MS},
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    )
    assert answer.status_code == 200, answer.text
    version = answer.json()["version"]
    patched_at = time.monotonic()
    wait_until(
        lambda: statuses(c1, token) == {n: (version, "in-sync") for n in ("c1", "w1", "w2")},
        timeout=IN_SYNC_BOUND_S,
        what="c1, w1 and w2 in-sync at the new version",
    )
    assert time.monotonic() - patched_at <= IN_SYNC_BOUND_S
    assert all(applied_ttl(w) == (version, TTL_MS) for w in workers)
    shown = run_cli(
        ["admin", "--url", c1.url, "--token", token, "cluster-settings", "show", "--propagation", "--json"]
    )
    assert shown.returncode == 0, shown.stderr
    report = json.loads(shown.stdout)["propagation"]
    assert [(e["instance_id"], e["role"], e["status"]) for e in report["orchestrators"]] == [
        ("c1", "coordinator", "in-sync"),
        ("w1", "worker", "in-sync"),
        ("w2", "worker", "in-sync"),
    ]

    lower_row_version(pg_cluster, c1, version - 1)
    wait_until(
        lambda: (
            statuses(c1, token)
            == {"c1": (version - 1, "in-sync"), "w1": (version, "ahead"), "w2": (version, "ahead")}
        ),
        timeout=10,
        what="the workers reported ahead of the restored row",
    )
    wait_until(
        lambda: statuses(c1, token) == {n: (version - 1, "in-sync") for n in ("c1", "w1", "w2")},
        timeout=10,
        what="the workers re-pulled and report in-sync at the lowered version",
    )
    # The lowered row holds no TTL override: the coordinator's default is served and applied.
    assert all(applied_ttl(w) == (version - 1, 3_600_000) for w in workers)
    for worker in workers:
        assert f"applied cluster settings version {version - 1} from c1 (restored" in worker.output()


def test_a_single_coordinator_serves_its_worker_on_either_database(any_cluster: Cluster) -> None:
    c1 = any_cluster.coordinator("c1", **BEATS)
    token = any_cluster.token
    worker = any_cluster.worker("w1", [c1], join_token=any_cluster.join_token(c1), **BEATS)
    wait_until(lambda: "w1" in statuses(c1, token), what="w1 in the report")
    shown = run_cli(
        [
            "admin",
            "--url",
            c1.url,
            "--token",
            token,
            "cluster-settings",
            "set",
            f"agent_token_ttl_ms={TTL_MS}",
        ]
    )
    assert shown.returncode == 0, shown.stderr
    version = int(shown.stdout.split()[1].rstrip(";"))
    wait_until(
        lambda: statuses(c1, token) == {"c1": (version, "in-sync"), "w1": (version, "in-sync")},
        timeout=IN_SYNC_BOUND_S,
        what="c1 and w1 in-sync",
    )
    assert applied_ttl(worker) == (version, TTL_MS)
    lower_row_version(any_cluster, c1, version - 1)
    wait_until(
        lambda: statuses(c1, token)["w1"] == (version - 1, "in-sync"),
        timeout=10,
        what="w1 adopts the restored row",
    )
