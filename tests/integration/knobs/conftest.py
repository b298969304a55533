"""Fixtures for knob behaviour tests: the in-process server on both dialects."""

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.support.inprocess import InProcessServer, in_process_server

FAST = {
    "CONVEYOR_SWEEP_INTERVAL_MS": "200",
    "CONVEYOR_CLUSTER_HEARTBEAT_INTERVAL_MS": "200",
    "CONVEYOR_CLUSTER_SETTINGS_CACHE_TTL_MS": "0",
    # The tests drive the retention sweep themselves, with a clock of their choosing.
    "CONVEYOR_RETENTION_INTERVAL_MS": "3600000",
}


@pytest.fixture
async def server(database_url: str, tmp_path: Path) -> AsyncIterator[InProcessServer]:
    """The real app with its start-up hooks, on a fresh database of each dialect."""
    async with in_process_server(database_url, tmp_path / "home", env=FAST) as running:
        yield running


# The fake GitHub serving a repository, for the ingest knobs.
from tests.integration.ingest.conftest import github, repo  # noqa: E402, F401
