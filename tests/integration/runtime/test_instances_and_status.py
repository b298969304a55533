"""Instance rows, boot checks, `cluster/status` and the propagation report through the real app."""

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from conveyor.db.engine import Database
from conveyor.db.tables import cluster_instances, leader_lease
from conveyor.runtime import runtime_services, store
from conveyor.runtime.boot import RUNTIME
from tests.integration.runtime.conftest import IN_PROCESS_CLUSTER
from tests.support.inprocess import InProcessServer, in_process_server
from tests.support.waiting import async_wait_until

# Coordinators of one cluster share the secret key (the second one's secrets hook refuses another).
SHARED_SECRET_KEY = "0f" * 32


async def instance_rows(db: Database) -> list[store.InstanceRow]:
    async with db.read() as conn:
        return await store.list_instances(conn)


async def test_a_started_node_beats_its_row_and_leads(server: InProcessServer) -> None:
    services = runtime_services(server.state.parts)
    rows = await instance_rows(server.state.db)
    assert [(r.instance_id, r.boot_id, r.role) for r in rows] == [
        (services.identity.instance_id, services.identity.boot_id, "coordinator")
    ]
    first_beat = rows[0].last_heartbeat_at

    async def beat_again() -> bool:
        return (await instance_rows(server.state.db))[0].last_heartbeat_at > first_beat

    await async_wait_until(beat_again, timeout=15, what="a second heartbeat")
    assert services.leadership.is_leader
    assert "conveyor_leader 1.0" in server.state.metrics.render().decode()


async def test_health_shows_the_instance_id(server: InProcessServer) -> None:
    health = (await server.client.get("/health")).json()
    assert health["instance_id"] == runtime_services(server.state.parts).identity.instance_id


async def test_cluster_status_lists_this_node_as_the_live_leader(server: InProcessServer) -> None:
    seen: list[dict[str, Any]] = []

    async def live_in_status() -> bool:
        answer = await server.client.get("/api/v1/admin/cluster/status", headers=server.auth())
        assert answer.status_code == 200, answer.text
        body = answer.json()
        (instance,) = body["instances"]
        # `live` is the heartbeat's age against the window, whatever the moment (a stalled loop skips beats).
        age, window = instance["last_heartbeat_age_ms"], body["stale_window_ms"]
        assert age <= window if instance["live"] else age >= window  # (the age is whole milliseconds)
        seen.append(body)
        return bool(instance["live"])

    await async_wait_until(live_in_status, timeout=15, what="the node to be listed live")
    body = seen[-1]
    me = runtime_services(server.state.parts).identity.instance_id
    assert body["instance_id"] == me and body["leader"] == me
    assert body["lease"]["epoch"] >= 1 and body["lease"]["live"]
    (instance,) = body["instances"]
    assert instance["self"] and instance["leader"]
    auditor = await server.mint("auditor")
    assert (
        await server.client.get("/api/v1/admin/cluster/status", headers=server.auth(auditor))
    ).status_code == 200


async def test_propagation_shows_this_node_in_sync_after_a_change(server: InProcessServer) -> None:
    url = "/api/v1/admin/cluster-settings"
    await server.client.patch(url, json={"agent_token_ttl_ms": 120_000}, headers=server.auth())
    report = (await server.client.get(url + "/propagation", headers=server.auth())).json()
    assert report["current_version"] == 1
    me = report["orchestrators"][0]
    assert me["self"] and me["applied_version"] == 1 and me["status"] == "in-sync"

    async def row_reports_version_one() -> bool:
        return (await instance_rows(server.state.db))[0].applied_settings_version == 1

    await async_wait_until(row_reports_version_one, timeout=15, what="the heartbeat to report version 1")


async def test_propagation_reports_other_rows_behind_and_ahead(server: InProcessServer) -> None:
    async with server.state.db.transaction() as conn:
        now = await store.database_now(conn)
        for instance_id, version in (("peer-behind", 0), ("peer-ahead", 9)):
            await store.beat_instance(
                conn,
                instance_id=instance_id,
                boot_id="b",
                role="worker",
                advertise_url=None,
                software_version="x",
                started_at=now,
                draining=False,
                applied_settings_version=version,
            )
    await server.client.patch(
        "/api/v1/admin/cluster-settings", json={"queue_max_depth": 5}, headers=server.auth()
    )
    report = (
        await server.client.get("/api/v1/admin/cluster-settings/propagation", headers=server.auth())
    ).json()
    statuses = {e["instance_id"]: e["status"] for e in report["orchestrators"][1:]}
    assert statuses == {"peer-ahead": "ahead", "peer-behind": "behind"}


async def test_clean_shutdown_deletes_the_row_and_releases_the_lease(
    database_url: str, tmp_path: Path
) -> None:
    async with in_process_server(database_url, tmp_path / "home", env=IN_PROCESS_CLUSTER) as server:
        db_url = server.state.db.url
    db = Database.connect(db_url)
    try:
        assert await instance_rows(db) == []
        async with db.transaction() as conn:
            lease = await store.read_lease(conn)
            assert lease is not None and lease.expires_at <= await store.database_now(conn)
            assert await store.acquire_lease(conn, "successor", timedelta(seconds=5)) == lease.epoch + 1
    finally:
        await db.dispose()


async def test_a_crashed_predecessors_row_does_not_stop_a_restart(database_url: str, tmp_path: Path) -> None:
    home = tmp_path / "home"
    async with in_process_server(
        database_url, home, env={**IN_PROCESS_CLUSTER, "CONVEYOR_INSTANCE_ID": "node-1"}
    ) as server:
        pass
    db = Database.connect(server.state.db.url)
    try:
        async with db.transaction() as conn:  # what a SIGKILL leaves behind: a row that stopped beating
            now = await store.database_now(conn)
            await store.beat_instance(
                conn,
                instance_id="node-1",
                boot_id="crashed-boot",
                role="coordinator",
                advertise_url=None,
                software_version="x",
                started_at=now,
                draining=False,
                applied_settings_version=0,
            )
    finally:
        await db.dispose()
    async with in_process_server(
        database_url, home, env={**IN_PROCESS_CLUSTER, "CONVEYOR_INSTANCE_ID": "node-1"}
    ) as again:
        assert again.state.startup.fatal is None
        assert runtime_services(again.state.parts).identity.instance_id == "node-1"
        async with again.state.db.read() as conn:
            rows = (await conn.execute(select(cluster_instances.c.boot_id))).scalars().all()
        assert rows == [runtime_services(again.state.parts).identity.boot_id]


async def test_a_second_coordinator_on_one_sqlite_file_fails_to_boot(
    tmp_path: Path, sqlite_template: Path
) -> None:
    import shutil

    path = tmp_path / "conveyor.db"
    shutil.copyfile(sqlite_template, path)
    url = f"sqlite:///{path}"
    async with in_process_server(url, tmp_path / "a", env=IN_PROCESS_CLUSTER) as first:
        assert first.state.startup.fatal is None
        async with in_process_server(
            url, tmp_path / "b", env={**IN_PROCESS_CLUSTER, "CONVEYOR_INSTANCE_ID": "other"}
        ) as second:
            assert second.state.startup.fatal == "SQLite supports one coordinator; use PostgreSQL"
            assert RUNTIME not in second.state.parts
        async with first.state.db.read() as conn:
            holders = (await conn.execute(select(leader_lease.c.holder))).scalars().all()
        assert holders == [runtime_services(first.state.parts).identity.instance_id]


@pytest.mark.postgres_only
async def test_a_live_twin_with_the_same_instance_id_fails_to_boot_on_postgresql(
    postgres_url: str, tmp_path: Path
) -> None:
    env = {**IN_PROCESS_CLUSTER, "CONVEYOR_INSTANCE_ID": "twin", "CONVEYOR_SECRET_KEY": SHARED_SECRET_KEY}
    async with in_process_server(postgres_url, tmp_path / "a", env=env) as first:
        async with in_process_server(postgres_url, tmp_path / "b", env=env) as second:
            assert second.state.startup.fatal is not None
            assert second.state.startup.fatal.startswith("duplicate instance_id twin")
        assert first.state.startup.fatal is None
        assert [r.instance_id for r in await instance_rows(first.state.db)] == ["twin"]


@pytest.mark.postgres_only
async def test_two_coordinators_on_postgresql_share_one_leader(postgres_url: str, tmp_path: Path) -> None:
    env = {**IN_PROCESS_CLUSTER, "CONVEYOR_SECRET_KEY": SHARED_SECRET_KEY}
    async with in_process_server(postgres_url, tmp_path / "a", env=env) as first:
        async with in_process_server(postgres_url, tmp_path / "b", env=env) as second:
            assert second.state.startup.fatal is None
            leaders = [runtime_services(s.state.parts).leadership.is_leader for s in (first, second)]
            assert leaders == [True, False]
            status = (await second.client.get("/api/v1/admin/cluster/status", headers=second.auth())).json()
            assert status["leader"] == runtime_services(first.state.parts).identity.instance_id
            assert len(status["instances"]) == 2
