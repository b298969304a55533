"""`conveyor admin peer list|join-token|revoke` against a real coordinator (docs/design/cluster.md §7.3)."""

import json

import pytest

from tests.support.cluster import Cluster
from tests.support.processes import run_cli
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("cluster-processes"), pytest.mark.timeout(300)]

# Nothing here is about staleness: a 1 s beat (3 s stale window) keeps a loaded box from dropping the
# session between the listing and the revoke, which would make `sessions_closed` 0.
STEADY = {"CONVEYOR_CLUSTER_HEARTBEAT_INTERVAL_MS": "1000"}


def test_peer_cli_makes_a_join_token_lists_the_worker_and_revokes_it(pg_cluster: Cluster) -> None:
    c1 = pg_cluster.coordinator("c1", **STEADY)
    env = {"CONVEYOR_URL": c1.url, "CONVEYOR_TOKEN": pg_cluster.token}
    made = run_cli(["admin", "peer", "join-token", "--role", "worker", "--json"], env=env)
    assert made.returncode == 0, made.stderr
    token = json.loads(made.stdout)["token"]
    assert token.startswith("cvy_join_")
    pg_cluster.worker("w1", [c1], join_token=token, **STEADY)

    def listed() -> bool:
        shown = run_cli(["admin", "peer", "list"], env=env)
        return shown.returncode == 0 and any(
            line.split()[:3] == ["w1", "worker", "yes"] for line in shown.stdout.splitlines()
        )

    wait_until(listed, what="peer list shows w1 connected as a worker")
    revoked = run_cli(["admin", "peer", "revoke", "w1", "--json"], env=env)
    assert revoked.returncode == 0, revoked.stderr
    assert json.loads(revoked.stdout) == {"instance_id": "w1", "revoked_credentials": 1, "sessions_closed": 1}
    listing = json.loads(run_cli(["admin", "peer", "list", "--json"], env=env).stdout)
    assert listing["items"][0]["credential_revoked_at"] is not None


def test_peer_cli_refusals_exit_non_zero_with_the_reason(pg_cluster: Cluster) -> None:
    c1 = pg_cluster.coordinator("c1")
    env = {"CONVEYOR_URL": c1.url, "CONVEYOR_TOKEN": pg_cluster.token}
    short = run_cli(["admin", "peer", "join-token", "--role", "worker", "--expires-in-ms", "5"], env=env)
    assert short.returncode == 2 and "out_of_range" in short.stderr
    unknown = run_cli(["admin", "peer", "revoke", "nobody"], env=env)
    assert unknown.returncode == 4 and "not_found" in unknown.stderr
