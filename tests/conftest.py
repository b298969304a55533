"""Shared fixtures: the `database` fixture runs every database test on SQLite and on PostgreSQL.

Each test gets a fresh, migrated database: a copy of a per-worker template (a file copy on SQLite,
`CREATE DATABASE … TEMPLATE` on PostgreSQL), so tests never see each other's rows and migrations
run once per worker. Every PostgreSQL database created here is dropped at the end.
"""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiodocker
import pytest

from conveyor.db.engine import Database
from conveyor.db.migrate import upgrade_to
from tests.support import postgres
from tests.support.docker import SKIPPED, DockerEngine, engine_for_tests, skipped_deliberately

DIALECTS = ["sqlite", "postgresql"]

# CONVEYOR_TEST_CPU_REPORT=DIR records each test's CPU seconds (tests/support/cpu_report.py).
pytest_plugins = ["tests.support.cpu_report"]


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A migrated SQLite file to copy."""
    path = tmp_path_factory.mktemp("sqlite-template") / "template.db"
    upgrade_to(f"sqlite:///{path}")
    return path


@pytest.fixture(scope="session")
def postgres_template() -> Iterator[str]:
    """A migrated PostgreSQL database to clone (its name)."""
    postgres.check_reachable()
    name = postgres.new_database_name("tmpl_")
    url = postgres.create_database(name)
    try:
        upgrade_to(url)
        yield name
    finally:
        postgres.drop_database(name)


def _fresh_url(dialect: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if dialect == "sqlite":
        template: Path = request.getfixturevalue("sqlite_template")
        path = tmp_path / "conveyor.db"
        shutil.copyfile(template, path)
        yield f"sqlite:///{path}"
        return
    template_name: str = request.getfixturevalue("postgres_template")
    name = postgres.new_database_name()
    url = postgres.create_database(name, template=template_name)
    try:
        yield url
    finally:
        postgres.drop_database(name)


@pytest.fixture(params=DIALECTS)
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """URL of a fresh, migrated database, once per dialect."""
    yield from _fresh_url(request.param, request, tmp_path)


@pytest.fixture(scope="module", params=DIALECTS)
def module_database_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """A fresh, migrated database shared by one module's tests (for a server they share), once per dialect."""
    yield from _fresh_url(request.param, request, tmp_path_factory.mktemp("module-db"))


@pytest.fixture(params=DIALECTS)
def empty_database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """URL of a fresh database with no schema, once per dialect."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'empty.db'}"
        return
    postgres.check_reachable()
    name = postgres.new_database_name()
    url = postgres.create_database(name)
    try:
        yield url
    finally:
        postgres.drop_database(name)


@pytest.fixture
def postgres_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, migrated PostgreSQL database (for PostgreSQL-only tests such as several coordinators)."""
    yield from _fresh_url("postgresql", request, tmp_path)


async def _opened(url: str) -> AsyncIterator[Database]:
    db = Database.connect(url, pool_size=4)
    try:
        yield db
    finally:
        await db.dispose()


@pytest.fixture
async def pg_database(postgres_url: str) -> AsyncIterator[Database]:
    """An open `Database` on a fresh, migrated PostgreSQL database (PostgreSQL-only tests)."""
    async for db in _opened(postgres_url):
        yield db


@pytest.fixture
async def database(database_url: str) -> AsyncIterator[Database]:
    """An open `Database` on a fresh, migrated database, once per dialect."""
    async for db in _opened(database_url):
        yield db


@pytest.fixture
def server_env() -> dict[str, str]:
    """Extra `CONVEYOR_*` settings of the `server` fixture: a folder's conftest or a module overrides this."""
    return {}


@pytest.fixture
async def server(database_url: str, tmp_path: Path, server_env: dict[str, str]) -> AsyncIterator[Any]:
    """The real app in this process (`tests.support.inprocess.InProcessServer`) on a fresh database of each
    dialect, with an owner token and `server_env`."""
    from tests.support.inprocess import in_process_server  # imports the whole server: not for unit tests

    async with in_process_server(database_url, tmp_path / "home", env=server_env) as running:
        yield running


@pytest.fixture(scope="session")
def docker_engine() -> DockerEngine:
    """The test run's Docker engine with the test images (fails, saying how to provide one, if there is none)."""
    return engine_for_tests()


@pytest.fixture
async def docker(docker_engine: DockerEngine) -> AsyncIterator[aiodocker.Docker]:
    """An Engine API client of the test run's engine."""
    async with aiodocker.Docker(url=docker_engine.host) as client:
        yield client


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say at the end of the run that the container tests were skipped on purpose, when they were."""
    if skipped_deliberately():
        terminalreporter.write_line(f"container tests: {SKIPPED}", yellow=True)


def pytest_configure(config: pytest.Config) -> None:
    """Say plainly, before any worker starts, that this pytest breaks `--dist loadgroup` (see below)."""
    if config.getoption("dist", "no") == "loadgroup" and int(pytest.__version__.split(".")[0]) >= 9:
        raise pytest.UsageError(
            f"pytest {pytest.__version__} drops pytest-xdist's xdist_group suffix, so --dist loadgroup would run "
            "the cluster tests all at once: install the pinned pytest (pip install -e '.[test]')"
        )


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Refuse to run when `--dist loadgroup` would silently ignore `xdist_group` marks.

    The cluster tests start several real servers each and share the group "cluster-processes" so they
    run one at a time (three groups at once exhausted PostgreSQL's default 100 connections); pytest-xdist marks a grouped test by suffixing its node id with `@group`, and a
    pytest that stores node ids elsewhere (pytest 9 with xdist 3.8) drops the suffix without a word, which
    runs them all at once and overloads the machine.
    """
    if not getattr(config.option, "loadgroup", False):  # set by pytest-xdist in its workers
        return
    lost = [
        item.nodeid for item in items if item.get_closest_marker("xdist_group") and "@" not in item.nodeid
    ]
    if lost:
        raise pytest.UsageError(
            f"--dist loadgroup ignores the xdist_group mark of {len(lost)} tests (e.g. {lost[0]}): "
            "this pytest and pytest-xdist do not work together; see the pytest pin in pyproject.toml"
        )
