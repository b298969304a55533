"""Fixtures for knob behaviour tests: the in-process server on both dialects."""

import pytest

FAST = {
    "CONVEYOR_SWEEP_INTERVAL_MS": "200",
    "CONVEYOR_CLUSTER_HEARTBEAT_INTERVAL_MS": "200",
    "CONVEYOR_CLUSTER_SETTINGS_CACHE_TTL_MS": "0",
    # The tests drive the retention sweep themselves, with a clock of their choosing.
    "CONVEYOR_RETENTION_INTERVAL_MS": "3600000",
}


@pytest.fixture
def server_env() -> dict[str, str]:
    """Settings of the real app with its start-up hooks, on a fresh database of each dialect."""
    return FAST


# The fake GitHub serving a repository, for the ingest knobs.
from tests.integration.ingest.conftest import github, repo  # noqa: E402, F401
