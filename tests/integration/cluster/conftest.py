"""Fixtures for multi-process cluster tests: a `Cluster` that ends exactly what it started."""

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cluster import Cluster


@pytest.fixture
def pg_cluster(postgres_url: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """Coordinators on one fresh PostgreSQL database."""
    cluster = Cluster(tmp_path, postgres_url)
    yield from _run(cluster, request)


@pytest.fixture(params=["sqlite", "postgresql"])
def any_cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Cluster]:
    """A single-coordinator cluster on each database (SQLite: the coordinator's own embedded file)."""
    url = request.getfixturevalue("postgres_url") if request.param == "postgresql" else None
    yield from _run(Cluster(tmp_path, url), request)


def _run(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[Cluster]:
    try:
        yield cluster
    finally:
        report = getattr(request.node, "rep_call", None)
        if report is not None and report.failed:
            print(cluster.logs())
        cluster.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    """Keep each phase's report on the item so a failing test can attach every node's log."""
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)
