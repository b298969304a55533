"""Keys at boot: generated on first boot, recorded by fingerprint, and a node on another key refused."""

import asyncio
import os
import stat
from pathlib import Path

import pytest
from sqlalchemy import insert, select

from conveyor.db.engine import Database
from conveyor.db.tables import cluster_instances, secret_key_versions
from conveyor.model.ids import utc_now
from conveyor.secrets.crypto import MasterKey
from conveyor.secrets.keys import KeyConfigError
from conveyor.secrets.service import SECRETS, SecretService
from conveyor.secrets.startup import advertise, start
from tests.integration.secrets.conftest import KEY_A, KEY_B, key_env, service_for
from tests.support.inprocess import in_process_server


async def recorded_versions(db: Database) -> list[tuple[int, str]]:
    async with db.read() as conn:
        rows = await conn.execute(select(secret_key_versions.c.version, secret_key_versions.c.fingerprint))
        return sorted((r.version, r.fingerprint) for r in rows)


async def test_without_a_key_the_first_boot_generates_one_with_mode_0600_and_records_it(
    database: Database, tmp_path: Path
) -> None:
    home = tmp_path / "first"
    service = await service_for(database, home)
    key_file = home / "secret.key"
    assert stat.S_IMODE(os.stat(key_file).st_mode) == 0o600
    assert await recorded_versions(database) == [(1, service.fingerprint)]

    again = await service_for(database, home)
    assert again.fingerprint == service.fingerprint
    assert await recorded_versions(database) == [(1, service.fingerprint)]


async def test_a_second_node_without_a_key_is_told_to_copy_the_first_nodes_key_file(
    database: Database, tmp_path: Path
) -> None:
    first = await service_for(database, tmp_path / "first")
    with pytest.raises(KeyConfigError, match="CONVEYOR_SECRET_KEY_FILE") as caught:
        await service_for(database, tmp_path / "second")
    assert first.fingerprint in str(caught.value)
    assert not (tmp_path / "second" / "secret.key").exists()
    joined = await service_for(
        database, tmp_path / "second", CONVEYOR_SECRET_KEY_FILE=str(tmp_path / "first" / "secret.key")
    )
    assert joined.fingerprint == first.fingerprint


async def test_a_node_whose_key_differs_from_the_recorded_one_refuses_to_boot(
    database: Database, tmp_path: Path
) -> None:
    await service_for(database, tmp_path / "a", CONVEYOR_SECRET_KEY=KEY_A)
    with pytest.raises(KeyConfigError, match="is not the cluster's") as caught:
        await service_for(database, tmp_path / "b", CONVEYOR_SECRET_KEY=KEY_B)
    assert "CONVEYOR_SECRET_KEY_FILE" in str(caught.value)
    assert KEY_B not in str(caught.value)


async def test_racing_first_boots_agree_on_one_key(database: Database, tmp_path: Path) -> None:
    outcomes = await asyncio.gather(
        *(service_for(database, tmp_path / f"node{i}") for i in range(3)), return_exceptions=True
    )
    winners = [o for o in outcomes if isinstance(o, SecretService)]
    assert len(winners) == 1, outcomes
    assert all(isinstance(o, KeyConfigError) for o in outcomes if o not in winners)
    assert await recorded_versions(database) == [(1, winners[0].fingerprint)]
    assert [(tmp_path / f"node{i}" / "secret.key").exists() for i in range(3)].count(True) == 1


async def test_a_malformed_key_stops_the_node_without_printing_it(database_url: str, tmp_path: Path) -> None:
    bad = "not-a-key-" + "x" * 30
    async with in_process_server(database_url, tmp_path / "home", env={"CONVEYOR_SECRET_KEY": bad}) as server:
        fatal = server.state.startup.fatal
        assert fatal is not None and "CONVEYOR_SECRET_KEY is not a valid master key" in fatal
        assert bad not in fatal
        answer = await server.client.get("/api/v1/admin/secrets", headers=server.auth())
        assert answer.status_code == 503


async def test_the_hooks_publish_the_store_and_advertise_the_fingerprint(
    database_url: str, tmp_path: Path
) -> None:
    async with in_process_server(database_url, tmp_path / "home", env=key_env()) as server:
        state = server.state
        assert isinstance(state.parts.need(SECRETS), SecretService)
        async with state.db.transaction() as conn:
            now = utc_now()
            await conn.execute(
                insert(cluster_instances).values(
                    instance_id="node-under-test",
                    boot_id="b",
                    role="coordinator",
                    software_version="test",
                    started_at=now,
                    last_heartbeat_at=now,
                )
            )
        state.instance_id = "node-under-test"
        await start(state)
        await advertise(state)  # after the runtime core settled the identity
        async with state.db.read() as conn:
            advertised = (
                await conn.execute(
                    select(cluster_instances.c.secret_key_fingerprint).where(
                        cluster_instances.c.instance_id == "node-under-test"
                    )
                )
            ).scalar_one()
        assert advertised == MasterKey.of(bytes.fromhex(KEY_A)).fingerprint
