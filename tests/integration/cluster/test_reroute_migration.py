"""Migrations 0011 (`jobs.reroute_*`), 0012 (`dispatch_history.reason`, `.reroute_hop`) and 0013
(`scaler_spawns.adopted_by`, `.adopted_at`) add their columns on both databases and come back out cleanly."""

from __future__ import annotations

import pytest
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


def _columns(url: str, table: str) -> set[str]:
    engine = create_sync_engine(url)
    try:
        return {column["name"] for column in sa.inspect(engine).get_columns(table)}
    finally:
        engine.dispose()


@pytest.mark.parametrize(
    ("before", "table", "added", "kept"),
    [
        ("0010", "jobs", REROUTE_COLUMNS, "status"),
        ("0011", "dispatch_history", {"reason", "reroute_hop"}, "outcome"),
        ("0012", "scaler_spawns", {"adopted_by", "adopted_at"}, "node_id"),
        ("0012", "scaler_spawn_history", {"adopted_by"}, "outcome"),
    ],
    ids=["0011-jobs", "0012-dispatch-history", "0013-scaler-spawns", "0013-scaler-spawn-history"],
)
def test_reroute_columns_upgrade_and_downgrade(
    empty_database_url: str, before: str, table: str, added: set[str], kept: str
) -> None:
    upgrade_to(empty_database_url, before)
    assert not added & _columns(empty_database_url, table)

    upgrade_to(empty_database_url)
    assert added <= _columns(empty_database_url, table)

    config = alembic_config()
    config.set_main_option("sqlalchemy.url", empty_database_url)
    engine = create_sync_engine(empty_database_url)
    try:
        with engine.begin() as connection:
            config.attributes["connection"] = connection
            command.downgrade(config, before)
    finally:
        engine.dispose()
    assert not added & _columns(empty_database_url, table)
    assert kept in _columns(empty_database_url, table)
