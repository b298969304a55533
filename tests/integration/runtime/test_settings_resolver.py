"""The settings resolver's cache: TTL, writer invalidation, env defaults, last good row on errors."""

import asyncio
from pathlib import Path

import pytest

from conveyor.db.engine import Database
from conveyor.model.knobs import ALL_KNOBS
from conveyor.runtime import store
from conveyor.runtime.settings import ClusterSettingsView, OrgSettingsView, SettingsResolver
from tests.support.inprocess import in_process_server
from tests.support.processes import free_port

DEFAULTS = {knob.name: knob.default for knob in ALL_KNOBS}


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def write_cluster_value(db: Database, name: str, value: int) -> None:
    async with db.transaction() as conn:
        stored = await store.lock_cluster_settings(conn)
        await store.write_cluster_settings(
            conn,
            {**stored.values, name: value},
            version=stored.version + 1,
            at=await store.database_now(conn),
            by="test",
        )


async def test_a_cached_row_is_served_until_its_ttl_passes(database: Database) -> None:
    clock = FakeClock()
    resolver = SettingsResolver(database, DEFAULTS, cache_ttl_ms=10_000, clock=clock)
    assert await resolver.cluster_value("queue_max_depth") == 1000
    await write_cluster_value(database, "queue_max_depth", 7)
    assert await resolver.cluster_value("queue_max_depth") == 1000
    clock.now += 10.001
    assert await resolver.cluster_value("queue_max_depth") == 7
    assert resolver.served_version == 1


async def test_forget_makes_the_next_read_fresh(database: Database) -> None:
    resolver = SettingsResolver(database, DEFAULTS, cache_ttl_ms=10_000, clock=FakeClock())
    await resolver.cluster()
    await write_cluster_value(database, "queue_max_depth", 9)
    resolver.forget_cluster()
    assert await resolver.cluster_value("queue_max_depth") == 9


async def test_a_read_in_flight_across_the_writers_forget_is_not_served_as_fresh(
    database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refresh that read the row before the write commits must not hide the write for a whole TTL."""
    resolver = SettingsResolver(database, DEFAULTS, cache_ttl_ms=10_000, clock=FakeClock())
    original = resolver.read_cluster_uncached
    read, release = asyncio.Event(), asyncio.Event()

    async def held_read() -> ClusterSettingsView:
        view = await original()
        read.set()
        await release.wait()
        return view

    monkeypatch.setattr(resolver, "read_cluster_uncached", held_read)
    in_flight = asyncio.create_task(resolver.cluster())
    await read.wait()
    monkeypatch.setattr(resolver, "read_cluster_uncached", original)
    await write_cluster_value(database, "queue_max_depth", 5)
    resolver.forget_cluster()
    release.set()
    assert (await in_flight).value("queue_max_depth") == 1000, "it began before the write"
    assert await resolver.cluster_value("queue_max_depth") == 5


async def test_an_org_read_in_flight_across_a_forget_is_not_served_as_fresh(
    database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    resolver = SettingsResolver(database, DEFAULTS, cache_ttl_ms=10_000, clock=FakeClock())
    read, release = asyncio.Event(), asyncio.Event()
    original = store.read_org_settings

    async def held_read(conn: object, org_id: str) -> object:
        row = await original(conn, org_id)  # type: ignore[arg-type]
        read.set()
        await release.wait()
        return row

    monkeypatch.setattr(store, "read_org_settings", held_read)
    in_flight = asyncio.create_task(resolver.org("default"))
    await read.wait()
    monkeypatch.setattr(store, "read_org_settings", original)
    resolver.forget_org("default")
    release.set()
    await in_flight
    reads: list[str] = []

    async def counted(conn: object, org_id: str) -> object:
        reads.append(org_id)
        return await original(conn, org_id)  # type: ignore[arg-type]

    monkeypatch.setattr(store, "read_org_settings", counted)
    view: OrgSettingsView = await resolver.org("default")
    assert reads == ["default"], "the row read before the forget was served as fresh"
    assert view.org_id == "default"


async def test_an_unreadable_database_serves_the_last_good_row_and_counts_the_error(
    database: Database,
) -> None:
    clock = FakeClock()
    errors: list[int] = []
    await write_cluster_value(database, "queue_max_depth", 11)
    resolver = SettingsResolver(
        database, DEFAULTS, cache_ttl_ms=100, clock=clock, on_read_error=lambda: errors.append(1)
    )
    assert await resolver.cluster_value("queue_max_depth") == 11
    resolver.db = Database.connect(
        f"postgresql://postgres@127.0.0.1:{free_port()}/nothing", connect_timeout_s=1
    )
    clock.now += 1
    assert await resolver.cluster_value("queue_max_depth") == 11
    assert await resolver.org_value("default", "queue_timeout_ms") == 3_600_000
    assert len(errors) >= 1
    await resolver.db.dispose()


async def test_without_any_good_row_an_unreadable_database_serves_the_configured_defaults() -> None:
    db = Database.connect(f"postgresql://postgres@127.0.0.1:{free_port()}/nothing", connect_timeout_s=1)
    errors: list[int] = []
    resolver = SettingsResolver(
        db, {**DEFAULTS, "queue_max_depth": 42}, cache_ttl_ms=100, on_read_error=lambda: errors.append(1)
    )
    assert await resolver.cluster_value("queue_max_depth") == 42
    assert errors == [1]
    await db.dispose()


async def test_an_env_default_shows_as_the_default_and_a_stored_value_beats_it(
    database_url: str, tmp_path: Path
) -> None:
    env = {"CONVEYOR_REROUTE_SPAWN_MAX_ATTEMPTS": "4"}
    async with in_process_server(database_url, tmp_path / "home", env=env) as server:
        url = "/api/v1/admin/cluster-settings"
        body = (await server.client.get(url, headers=server.auth())).json()
        assert body["defaults"]["reroute_spawn_max_attempts"] == 4
        assert body["effective"]["reroute_spawn_max_attempts"] == 4
        changed = await server.client.patch(
            url, json={"reroute_spawn_max_attempts": 6}, headers=server.auth()
        )
        assert changed.json()["effective"]["reroute_spawn_max_attempts"] == 6
        assert changed.json()["defaults"]["reroute_spawn_max_attempts"] == 4
