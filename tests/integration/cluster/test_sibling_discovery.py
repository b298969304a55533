"""Sibling discovery against `cluster_instances` racing a forget (docs/design/cluster.md §1, §7.1)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.cluster.service import HubIdentity, HubSettings, PeerHub
from conveyor.db.engine import Database
from conveyor.runtime import store as runtime_store


async def departed_coordinator_row(db: Database, instance_id: str) -> None:
    async with db.transaction() as conn:
        now = await runtime_store.database_now(conn)
        await runtime_store.beat_instance(
            conn,
            instance_id=instance_id,
            boot_id="boot-1",
            role="coordinator",
            advertise_url=None,
            software_version="0",
            started_at=now,
            draining=False,
            applied_settings_version=0,
        )


def hub_on(db: Database, tmp_path: Path) -> PeerHub:
    return PeerHub(
        identity=HubIdentity("c1", "coordinator", "0", None),
        settings=HubSettings(heartbeat_interval_ms=200, stale_beats=3),
        home=tmp_path,
        db=db,
    )


async def test_discovery_seeds_a_coordinator_row(database: Database, tmp_path: Path) -> None:
    await departed_coordinator_row(database, "c2")
    hub = hub_on(database, tmp_path)
    await hub._discover_siblings()  # one round of the discovery loop
    entry = hub.registry.get("c2")
    assert entry is not None and entry.role == "coordinator" and not entry.connected


async def test_rows_read_before_a_forget_do_not_bring_the_forgotten_peer_back(
    database: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    await departed_coordinator_row(database, "c2")
    hub = hub_on(database, tmp_path)
    await hub._discover_siblings()
    read, release = asyncio.Event(), asyncio.Event()
    original = runtime_store.list_instances

    async def held(conn: AsyncConnection) -> list[runtime_store.InstanceRow]:
        rows = await original(conn)
        read.set()
        await release.wait()
        return rows

    monkeypatch.setattr(runtime_store, "list_instances", held)
    discovery = asyncio.create_task(hub._discover_siblings())
    await read.wait()
    # The forget lands between the discovery's read and its seeding (its row delete commits later).
    assert hub.registry.forget("c2")
    release.set()
    await discovery
    assert hub.registry.get("c2") is None, "a stale read brought the forgotten coordinator back"
