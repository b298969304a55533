"""The shared scaler configuration's row (docs/design/scaler.md §11): how a set stores it, and how a coordinator's
watcher reads it, on both databases."""

from __future__ import annotations

from sqlalchemy import update

from conveyor.db.engine import Database
from conveyor.db.tables import scaler_config
from conveyor.scaler import store
from conveyor.scaler.config import SharedConfig, content_sha256
from conveyor.scaler.shared import database_source

FLEET = "version: 1\nscalers: []\n"
FLEET_V2 = (
    "version: 1\nscalers: [{name: fleet, type: bare-metal, max_agents: 1, label_sets: [{labels: [a]}]}]\n"
)


async def _set(db: Database, content: str) -> tuple[store.SharedConfigRow | None, int, bool]:
    async with db.transaction() as conn:
        return await store.store_shared_config(
            conn, content=content, sha256=content_sha256(content), by="tok"
        )


async def test_a_coordinator_reads_the_row_only_when_the_cluster_settings_version_moved(
    database: Database,
) -> None:
    settings_version = 0

    async def cached_settings_version() -> int:
        return settings_version

    source = database_source(database, cached_settings_version)
    assert await source(None) is None  # none stored
    _, settings_version, _ = await _set(database, FLEET)
    held = await source(None)
    assert held == SharedConfig(1, FLEET, content_sha256(FLEET))
    # A row changed behind the settings version's back is not looked at: a round reads no row of its own.
    async with database.transaction() as conn:
        await conn.execute(update(scaler_config).values(version=9, content=FLEET_V2, sha256="x"))
    assert await source(held) is held
    # The version moved (a set bumps it with the row): the row is read.
    settings_version += 1
    assert await source(held) == SharedConfig(9, FLEET_V2, "x")


async def test_a_set_stores_a_new_version_only_when_the_content_changed_and_bumps_the_settings_version(
    database: Database,
) -> None:
    first, settings_version, changed = await _set(database, FLEET)
    assert changed and first is not None and first.version == 1 and first.content == FLEET
    again, same_settings_version, changed = await _set(database, FLEET)
    assert not changed and again == first and same_settings_version == settings_version
    second, next_settings_version, changed = await _set(database, FLEET_V2)
    assert changed and next_settings_version == settings_version + 1
    assert second is not None and (second.version, second.content) == (2, FLEET_V2)
    assert second.sha256 == content_sha256(FLEET_V2) and second.updated_by == "tok"
    async with database.read() as conn:
        assert await store.read_shared_config(conn) == second  # what the set returns is the stored row
