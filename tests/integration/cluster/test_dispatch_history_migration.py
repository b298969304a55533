"""Migration 0012 adds `dispatch_history.reason` and `.reroute_hop` on both databases and comes back out cleanly."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import command

from conveyor.db.engine import create_sync_engine
from conveyor.db.migrate import alembic_config, upgrade_to

COLUMNS = {"reason", "reroute_hop"}


def _history_columns(url: str) -> set[str]:
    engine = create_sync_engine(url)
    try:
        return {column["name"] for column in sa.inspect(engine).get_columns("dispatch_history")}
    finally:
        engine.dispose()


def test_reroute_reason_columns_upgrade_and_downgrade(empty_database_url: str) -> None:
    upgrade_to(empty_database_url, "0011")
    assert not COLUMNS & _history_columns(empty_database_url)

    upgrade_to(empty_database_url)
    assert COLUMNS <= _history_columns(empty_database_url)

    config = alembic_config()
    config.set_main_option("sqlalchemy.url", empty_database_url)
    engine = create_sync_engine(empty_database_url)
    try:
        with engine.begin() as connection:
            config.attributes["connection"] = connection
            command.downgrade(config, "0011")
    finally:
        engine.dispose()
    assert not COLUMNS & _history_columns(empty_database_url)
    assert "outcome" in _history_columns(empty_database_url)
