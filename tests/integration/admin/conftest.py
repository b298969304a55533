"""Fixtures for admin API tests against the in-process app."""

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.support.inprocess import InProcessServer, in_process_server


@pytest.fixture
async def server(database_url: str, tmp_path: Path) -> AsyncIterator[InProcessServer]:
    """The real app on a fresh database of each dialect, with an owner token."""
    async with in_process_server(database_url, tmp_path / "home") as running:
        yield running
