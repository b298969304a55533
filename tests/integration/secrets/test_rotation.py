"""Master-key rotation (docs/design/admin.md §6, §9 scenario 10), on both dialects."""

import hashlib
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import insert

from conveyor.db.engine import Database
from conveyor.db.tables import cluster_instances, cluster_meta
from conveyor.model.ids import utc_now
from conveyor.secrets import store
from conveyor.secrets.rotation import RotationInProgress, rotate_to_current_key, rotation_status
from conveyor.secrets.service import SECRETS, SecretService
from conveyor.secrets.store import ROTATION_LOCK_KEY, SecretsColumn
from tests.integration.secrets.conftest import KEY_A, KEY_B, key_env, service_for
from tests.support.inprocess import InProcessServer, in_process_server

API = "/api/v1/admin"
VALUES = {("org", f"SECRET_{i}"): f"org-value-{i}-{'x' * i}" for i in range(5)} | {
    ("env/prod", "DEPLOY_TOKEN"): "prod-deploy-token",
    ("source:s1", "webhook_secret"): "hook-secret",
}


def digest(value: str | None) -> str:
    assert value is not None
    return hashlib.sha256(value.encode()).hexdigest()


async def put_all(server: InProcessServer, values: dict[tuple[str, str], str]) -> None:
    environment = await server.client.put(f"{API}/environments/prod", json={}, headers=server.auth())
    assert environment.status_code in (200, 201), environment.text
    for (scope, name), value in values.items():
        answer = await server.client.put(
            f"{API}/secrets/{scope}/{name}", json={"value": value}, headers=server.auth()
        )
        assert answer.status_code in (200, 201), answer.text


def store_of(server: InProcessServer) -> SecretService:
    service = server.state.parts.need(SECRETS)
    assert isinstance(service, SecretService)
    return service


async def test_rotation_moves_every_row_to_the_new_key_after_which_the_old_key_can_go(
    database_url: str, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    async with in_process_server(database_url, home, env=key_env(KEY_A)) as first:
        await put_all(first, VALUES)

    async with in_process_server(database_url, home, env=key_env(KEY_B, old=KEY_A)) as rotating:
        assert rotating.state.startup.fatal is None, rotating.state.startup.fatal
        # Before rotate-key, writes stay on the cluster's registered key (version 1).
        late = await rotating.client.put(
            f"{API}/secrets/org/LATE", json={"value": "late-value"}, headers=rotating.auth()
        )
        assert late.json()["key_version"] == 1
        before = (await rotating.client.get(f"{API}/secrets/rotation", headers=rotating.auth())).json()
        assert before["current_version"] == 1 and before["versions"][0]["total"] == len(VALUES) + 1

        rotated = await rotating.client.post(f"{API}/secrets/rotate-key", headers=rotating.auth())
        assert rotated.status_code == 200, rotated.text
        assert rotated.json() == {"version": 2, "reencrypted": {"secrets": len(VALUES) + 1}, "remaining": 0}
        status = (await rotating.client.get(f"{API}/secrets/rotation", headers=rotating.auth())).json()
        by_version = {v["version"]: v for v in status["versions"]}
        assert by_version[1]["total"] == 0 and by_version[2]["total"] == len(VALUES) + 1
        assert status["rows_on_old_versions"] == 0 and status["current_version"] == 2
        again = await rotating.client.post(f"{API}/secrets/rotate-key", headers=rotating.auth())
        assert again.json() == {"version": 2, "reencrypted": {"secrets": 0}, "remaining": 0}

    async with in_process_server(database_url, home, env=key_env(KEY_B)) as after:
        assert after.state.startup.fatal is None, after.state.startup.fatal
        service = store_of(after)
        async with after.state.db.read() as conn:
            for (scope, name), value in {**VALUES, ("org", "LATE"): "late-value"}.items():
                assert digest(await service.reveal(conn, scope, name)) == digest(value)

    async with in_process_server(database_url, home, env=key_env(KEY_A)) as stale_node:
        assert stale_node.state.startup.fatal is not None
        assert "CONVEYOR_SECRET_KEY_FILE" in stale_node.state.startup.fatal


async def test_without_a_new_key_rotation_finds_nothing_to_do(server: InProcessServer) -> None:
    await put_all(server, VALUES)
    answer = await server.client.post(f"{API}/secrets/rotate-key", headers=server.auth())
    assert answer.json() == {"version": 1, "reencrypted": {"secrets": 0}, "remaining": 0}


async def test_a_live_coordinator_on_another_key_makes_rotation_409_key_mismatch(
    server: InProcessServer,
) -> None:
    now = utc_now()
    async with server.state.db.transaction() as conn:
        for instance, heartbeat in (("live-other", now), ("long-gone", now - timedelta(hours=1))):
            await conn.execute(
                insert(cluster_instances).values(
                    instance_id=instance,
                    boot_id="b",
                    role="coordinator",
                    software_version="test",
                    started_at=heartbeat,
                    last_heartbeat_at=heartbeat,
                    secret_key_fingerprint="0123456789abcdef",
                )
            )
    answer = await server.client.post(f"{API}/secrets/rotate-key", headers=server.auth())
    assert answer.status_code == 409
    assert answer.json()["error"] == "key_mismatch"
    assert "live-other" in answer.json()["detail"] and "long-gone" not in answer.json()["detail"]


async def test_a_running_rotation_makes_another_409_until_its_lock_goes_stale(
    server: InProcessServer,
) -> None:
    async with server.state.db.transaction() as conn:
        await conn.execute(
            insert(cluster_meta).values(key=ROTATION_LOCK_KEY, value="other", created_at=utc_now())
        )
    busy = await server.client.post(f"{API}/secrets/rotate-key", headers=server.auth())
    assert busy.status_code == 409 and busy.json()["error"] == "rotation_in_progress"
    status = (await server.client.get(f"{API}/secrets/rotation", headers=server.auth())).json()
    assert status["in_progress"] is True
    async with server.state.db.transaction() as conn:
        await conn.execute(
            cluster_meta.update()
            .where(cluster_meta.c.key == ROTATION_LOCK_KEY)
            .values(created_at=utc_now() - timedelta(minutes=10))
        )
    assert (await server.client.post(f"{API}/secrets/rotate-key", headers=server.auth())).status_code == 200


async def test_an_interrupted_rotation_resumes_where_it_stopped(
    database: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = await service_for(database, tmp_path / "home", CONVEYOR_SECRET_KEY=KEY_A)
    async with database.transaction() as conn:
        for i in range(7):
            await old.set_secret(conn, "org", f"S{i}", f"value-{i}", updated_by="test")
    new = await service_for(
        database, tmp_path / "home", CONVEYOR_SECRET_KEY=KEY_B, CONVEYOR_SECRET_KEY_OLD=KEY_A
    )
    columns = (store.SECRETS_COLUMN,)
    live_since = utc_now() - timedelta(seconds=30)

    calls = {"n": 0}
    original = SecretsColumn.replace

    async def crash_on_the_fifth_row(self: SecretsColumn, conn, cell, ciphertext, version):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] == 5:
            raise RuntimeError("node died")
        return await original(self, conn, cell, ciphertext, version)

    monkeypatch.setattr(SecretsColumn, "replace", crash_on_the_fifth_row)
    with pytest.raises(RuntimeError, match="node died"):
        await rotate_to_current_key(
            database, new.keyring, columns, instance_id=None, live_since=live_since, batch_size=2
        )
    monkeypatch.setattr(SecretsColumn, "replace", original)

    halfway = await rotation_status(database, new.keyring, columns)
    assert {v.version: v.total for v in halfway.versions} == {1: 3, 2: 4}
    assert not halfway.in_progress  # the lock was released

    resumed = await rotate_to_current_key(
        database, new.keyring, columns, instance_id=None, live_since=live_since, batch_size=2
    )
    assert (resumed.version, resumed.reencrypted, resumed.remaining) == (2, {"secrets": 3}, 0)
    async with database.read() as conn:
        assert await new.secrets_for_job(conn, None) == {f"S{i}": f"value-{i}" for i in range(7)}


async def test_a_lost_lock_stops_a_rotation(
    database: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = await service_for(database, tmp_path / "home", CONVEYOR_SECRET_KEY=KEY_A)
    async with database.transaction() as conn:
        await old.set_secret(conn, "org", "S", "v", updated_by="test")
    new = await service_for(
        database, tmp_path / "home", CONVEYOR_SECRET_KEY=KEY_B, CONVEYOR_SECRET_KEY_OLD=KEY_A
    )

    async def taken_over(conn, holder, now):  # type: ignore[no-untyped-def]
        return False

    monkeypatch.setattr(store, "refresh_rotation_lock", taken_over)
    with pytest.raises(RotationInProgress):
        await rotate_to_current_key(
            database, new.keyring, (store.SECRETS_COLUMN,), instance_id=None, live_since=utc_now()
        )
