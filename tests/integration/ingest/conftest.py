"""Fixtures for ingest tests: a repository served by the fake GitHub, and the in-process server."""

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes.github import FakeGitHub
from tests.support.repos import DOCS_WORKFLOW, PUSH_WORKFLOW, make_repo

FAST = {"CONVEYOR_SWEEP_INTERVAL_MS": "200", "CONVEYOR_CLUSTER_HEARTBEAT_INTERVAL_MS": "200"}


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A repository with two workflows on `main`."""
    return make_repo(tmp_path / "repo", {"ci": PUSH_WORKFLOW, "docs": DOCS_WORKFLOW})


@pytest.fixture
def github(repo: Path) -> Iterator[FakeGitHub]:
    """The fake GitHub API serving `acme/app` from `repo`."""
    with FakeGitHub(repos={"acme/app": repo}, token="ghp_fake") as fake:
        yield fake


@pytest.fixture
def server_env() -> dict[str, str]:
    """Settings of the real app with its start-up hooks, on a fresh database of each dialect."""
    return {**FAST, "CONVEYOR_MAX_WEBHOOK_PAYLOAD_BYTES": "65536"}
