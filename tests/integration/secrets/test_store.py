"""The encrypted store on both dialects: values at rest, row identity, what a job sees
(docs/design/admin.md §6)."""

import hashlib
import os

import pytest
from sqlalchemy import select, update

from conveyor.db.engine import Database
from conveyor.db.tables import secrets
from conveyor.secrets import SecretIntegrityError
from conveyor.secrets.service import SecretService
from tests.integration.secrets.dumps import dump_database, leaked


def random_value(tag: str) -> str:
    return f"{tag}-{os.urandom(12).hex()}"


def digest(value: str | None) -> str:
    assert value is not None
    return hashlib.sha256(value.encode()).hexdigest()


async def put(store: SecretService, scope: str, name: str, value: str) -> None:
    async with store.db.transaction() as conn:
        await store.set_secret(conn, scope, name, value, updated_by="test")


async def test_no_dump_holds_a_value_yet_each_value_reads_back_exactly(
    secret_store: SecretService, database: Database
) -> None:
    values = {
        ("org", "DEPLOY_TOKEN"): random_value("deploy"),
        ("env/prod", "DEPLOY_TOKEN"): random_value("prod"),
        ("source:0190abcd", "webhook_secret"): random_value("hook"),
        ("org", "MULTILINE_KEY"): "-----BEGIN KEY-----\n" + random_value("pem") + "\n-----END KEY-----\n",
        ("org", "UNICODE"): "pässwörd-" + random_value("ü"),
    }
    for (scope, name), value in values.items():
        await put(secret_store, scope, name, value)

    dump = dump_database(database.url)
    assert "DEPLOY_TOKEN" in dump  # the dump is real and holds the rows
    assert leaked(dump, list(values.values())) == []
    async with database.read() as conn:
        for (scope, name), value in values.items():
            assert digest(await secret_store.reveal(conn, scope, name)) == digest(value)


async def test_a_ciphertext_copied_into_another_row_fails_with_an_integrity_error(
    secret_store: SecretService, database: Database
) -> None:
    await put(secret_store, "org", "A", "value-of-a")
    await put(secret_store, "org", "B", "value-of-b")
    async with database.transaction() as conn:
        stolen = (await conn.execute(select(secrets.c.ciphertext).where(secrets.c.name == "A"))).scalar_one()
        await conn.execute(update(secrets).where(secrets.c.name == "B").values(ciphertext=stolen))
    async with database.read() as conn:
        with pytest.raises(SecretIntegrityError, match="secrets:default:org:B failed authentication"):
            await secret_store.reveal(conn, "org", "B")
        assert await secret_store.reveal(conn, "org", "A") == "value-of-a"


async def test_swapping_two_rows_ciphertexts_makes_both_reads_fail(
    secret_store: SecretService, database: Database
) -> None:
    await put(secret_store, "org", "A", "value-of-a")
    await put(secret_store, "env/prod", "A", "value-of-prod-a")
    async with database.transaction() as conn:
        rows = {
            r.scope: r.ciphertext for r in await conn.execute(select(secrets.c.scope, secrets.c.ciphertext))
        }
        await conn.execute(
            update(secrets).where(secrets.c.scope == "org").values(ciphertext=rows["env/prod"])
        )
        await conn.execute(
            update(secrets).where(secrets.c.scope == "env/prod").values(ciphertext=rows["org"])
        )
    async with database.read() as conn:
        for scope in ("org", "env/prod"):
            with pytest.raises(SecretIntegrityError):
                await secret_store.reveal(conn, scope, "A")


async def test_a_job_sees_org_secrets_and_its_environment_wins_on_a_name_clash(
    secret_store: SecretService, database: Database
) -> None:
    await put(secret_store, "org", "TOKEN", "org-token")
    await put(secret_store, "org", "SHARED", "shared")
    await put(secret_store, "env/prod", "TOKEN", "prod-token")
    await put(secret_store, "env/staging", "TOKEN", "staging-token")
    await put(secret_store, "source:s1", "webhook_secret", "hook")
    async with database.read() as conn:
        assert await secret_store.secrets_for_job(conn, "prod") == {"SHARED": "shared", "TOKEN": "prod-token"}
        assert await secret_store.secrets_for_job(conn, None) == {"SHARED": "shared", "TOKEN": "org-token"}
        assert await secret_store.secrets_for_job(conn, "nowhere") == {
            "SHARED": "shared",
            "TOKEN": "org-token",
        }


async def test_source_secrets_are_read_by_source_and_never_given_to_jobs(
    secret_store: SecretService, database: Database
) -> None:
    async with database.transaction() as conn:
        await secret_store.set_source_secret(conn, "s1", "webhook_secret", "hook-1", updated_by="test")
        await secret_store.set_source_secret(conn, "s1", "clone_token", "clone-1", updated_by="test")
        await secret_store.set_source_secret(conn, "s2", "webhook_secret", "hook-2", updated_by="test")
    async with database.read() as conn:
        assert await secret_store.source_secret(conn, "s1", "webhook_secret") == "hook-1"
        assert await secret_store.source_secret(conn, "s1", "webhook_secret_next") is None
        assert await secret_store.source_secrets(conn, "s1") == {
            "webhook_secret": "hook-1",
            "clone_token": "clone-1",
        }
        assert await secret_store.secrets_for_job(conn, None) == {}
    async with database.transaction() as conn:
        assert await secret_store.delete_source_secrets(conn, "s1") == 2
    async with database.read() as conn:
        assert await secret_store.source_secrets(conn, "s1") == {}
        assert await secret_store.source_secret(conn, "s2", "webhook_secret") == "hook-2"


async def test_setting_a_secret_again_keeps_its_row_and_replaces_its_value(
    secret_store: SecretService, database: Database
) -> None:
    async with database.transaction() as conn:
        first = await secret_store.set_secret(conn, "org", "TOKEN", "one", updated_by="t1")
    async with database.transaction() as conn:
        second = await secret_store.set_secret(conn, "org", "TOKEN", "two", updated_by="t2")
    assert first.created and not second.created
    assert first.meta.id == second.meta.id and second.meta.updated_by == "t2"
    async with database.read() as conn:
        assert await secret_store.reveal(conn, "org", "TOKEN") == "two"


async def test_encrypted_columns_of_other_tables_are_bound_to_their_row(
    secret_store: SecretService, database: Database
) -> None:
    async with database.read() as conn:
        ciphertext, version = await secret_store.encrypt_column(
            conn, "sources", "s1", "webhook_secret", "hook"
        )
        assert version == 1
        assert (
            await secret_store.decrypt_column(conn, "sources", "s1", "webhook_secret", ciphertext, version)
            == "hook"
        )
        with pytest.raises(SecretIntegrityError, match="sources:s2:webhook_secret"):
            await secret_store.decrypt_column(conn, "sources", "s2", "webhook_secret", ciphertext, version)


async def test_a_job_gets_org_variables_overlaid_by_its_environments(
    secret_store: SecretService, database: Database
) -> None:
    from conveyor.model.ids import utc_now
    from conveyor.secrets import store

    async with database.transaction() as conn:
        await store.set_variable(conn, "default", "REGION", "us", utc_now())
        await store.set_variable(conn, "default", "TEAM", "ci", utc_now())
        await store.insert_environment(
            conn, "default", "prod", variables={"REGION": "eu"}, allowed_branches=["main"], at=utc_now()
        )
    async with database.read() as conn:
        prod = await secret_store.environment(conn, "prod")
        assert prod is not None and prod.allowed_branches == ("main",)
        assert await secret_store.environment(conn, "nowhere") is None
        assert await secret_store.variables_for_job(conn, prod) == {"REGION": "eu", "TEAM": "ci"}
        assert await secret_store.variables_for_job(conn, None) == {"REGION": "us", "TEAM": "ci"}
