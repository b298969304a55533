"""Fixtures for runtime-core tests: the in-process app with the short cluster timings of
docs/design/cluster.md §9."""

import pytest

# docs/design/cluster.md §9: the timings of multi-process cluster tests.
FAST_CLUSTER = {
    "CONVEYOR_CLUSTER_HEARTBEAT_INTERVAL_MS": "200",
    "CONVEYOR_CLUSTER_PEER_STALE_BEATS": "3",
    "CONVEYOR_CLUSTER_LEASE_TTL_MS": "1500",
    "CONVEYOR_CLUSTER_LEASE_RENEW_MS": "300",
    "CONVEYOR_CLUSTER_SETTINGS_CACHE_TTL_MS": "200",
}
# In-process tests share one event loop with the test itself, so they use a little more room: a busy
# CI box must not make a healthy node miss its lease or look stale.
IN_PROCESS_CLUSTER = {
    "CONVEYOR_CLUSTER_HEARTBEAT_INTERVAL_MS": "500",
    "CONVEYOR_CLUSTER_PEER_STALE_BEATS": "4",
    "CONVEYOR_CLUSTER_LEASE_TTL_MS": "6000",
    "CONVEYOR_CLUSTER_LEASE_RENEW_MS": "500",
    "CONVEYOR_CLUSTER_SETTINGS_CACHE_TTL_MS": "200",
}


@pytest.fixture
def server_env() -> dict[str, str]:
    """Settings of the real app on a fresh database of each dialect, with short cluster timings."""
    return IN_PROCESS_CLUSTER
