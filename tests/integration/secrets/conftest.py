"""Fixtures for secrets tests: known master keys, an in-process server, a store on a fresh database."""

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from conveyor.db.engine import Database
from conveyor.secrets.service import SecretService
from conveyor.secrets.startup import load_keyring
from conveyor.server.config import load_settings
from tests.support.inprocess import InProcessServer, in_process_server

KEY_A = "a1" * 32
KEY_B = "b2" * 32


def key_env(current: str | None = KEY_A, old: str | None = None) -> dict[str, str]:
    """`CONVEYOR_SECRET_KEY[_OLD]` for a server."""
    env = {}
    if current:
        env["CONVEYOR_SECRET_KEY"] = current
    if old:
        env["CONVEYOR_SECRET_KEY_OLD"] = old
    return env


async def service_for(db: Database, home: Path, **env: str) -> SecretService:
    """A `SecretService` as the start-up hook builds it (keys from `env`, generated under `home`)."""
    settings = load_settings(environ={"CONVEYOR_HOME": str(home), **env})
    return SecretService(db, await load_keyring(db, settings))


@pytest.fixture
async def secret_store(database: Database, tmp_path: Path) -> SecretService:
    """A store with key A on a fresh database of each dialect."""
    return await service_for(database, tmp_path / "home", CONVEYOR_SECRET_KEY=KEY_A)


@pytest.fixture
async def server(database_url: str, tmp_path: Path) -> AsyncIterator[InProcessServer]:
    """The real app with key A on a fresh database of each dialect."""
    async with in_process_server(database_url, tmp_path / "home", env=key_env()) as running:
        assert running.state.startup.fatal is None, running.state.startup.fatal
        yield running
