"""Migration 0011 adds the `jobs.reroute_*` columns on both databases and comes back out cleanly."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import command

from conveyor.db.engine import create_sync_engine
from conveyor.db.migrate import alembic_config, upgrade_to

REROUTE_COLUMNS = {
    "rerouted_to",
    "reroute_hop",
    "reroute_tried",
    "reroute_spawn_max_attempts",
    "reroute_spawn_retry_backoff_ms",
    "reroute_spawn_failures",
    "reroute_window_expires_at",
}


def _job_columns(url: str) -> set[str]:
    engine = create_sync_engine(url)
    try:
        return {column["name"] for column in sa.inspect(engine).get_columns("jobs")}
    finally:
        engine.dispose()


def test_reroute_columns_upgrade_and_downgrade(empty_database_url: str) -> None:
    upgrade_to(empty_database_url, "0010")
    assert not REROUTE_COLUMNS & _job_columns(empty_database_url)

    upgrade_to(empty_database_url)
    assert REROUTE_COLUMNS <= _job_columns(empty_database_url)

    config = alembic_config()
    config.set_main_option("sqlalchemy.url", empty_database_url)
    engine = create_sync_engine(empty_database_url)
    try:
        with engine.begin() as connection:
            config.attributes["connection"] = connection
            command.downgrade(config, "0010")
    finally:
        engine.dispose()
    assert not REROUTE_COLUMNS & _job_columns(empty_database_url)
