"""The secret store other packages use: encrypts on write, decrypts for the code that needs values.

Published at start-up as `state.parts` (key `SECRETS`) (a `SecretService`). Every method takes the
caller's connection, so a write can share the caller's transaction (a source created together with
its webhook secret) and a read can share its snapshot. Plaintexts leave this class only as return
values of the `reveal`/`…_for_job`/`source_…` methods; no route returns them and nothing logs them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.db.channels import SOURCE_CHANNEL
from conveyor.db.dialect import notify
from conveyor.db.engine import Database
from conveyor.db.tables import DEFAULT_ORG
from conveyor.model.ids import new_id, utc_now
from conveyor.parts import PartKey
from conveyor.secrets import store
from conveyor.secrets.crypto import (
    MasterKey,
    column_identity,
    decrypt_value,
    encrypt_value,
    secret_row_identity,
)
from conveyor.secrets.environments import Environment
from conveyor.secrets.keys import Keyring, KeyVersion, SecretKeyMissing
from conveyor.secrets.resolve import ScopedValue, scopes_visible_to_job, secrets_for_job, variables_for_job
from conveyor.secrets.scopes import check_secret_name, check_secret_value, parse_scope, source_scope
from conveyor.secrets.store import EncryptedColumn, SecretMeta


@dataclass(frozen=True)
class SecretWrite:
    """The outcome of setting a secret: its metadata and whether it was new."""

    meta: SecretMeta
    created: bool


class SecretService:
    """Encrypted secrets, environments and variables of one organisation."""

    def __init__(
        self,
        db: Database,
        keyring: Keyring,
        *,
        org_id: str = DEFAULT_ORG,
        encrypted_columns: tuple[EncryptedColumn, ...] = store.ENCRYPTED_COLUMNS,
        random_bytes: Callable[[int], bytes] = os.urandom,
        clock: Callable[[], datetime] = utc_now,
    ) -> None:
        self.db = db
        self.keyring = keyring
        self.org_id = org_id
        self.encrypted_columns = encrypted_columns
        self._random_bytes = random_bytes
        self._clock = clock

    @property
    def fingerprint(self) -> str:
        """This node's current key fingerprint (what heartbeats advertise as `secret_key_fingerprint`)."""
        return self.keyring.current.fingerprint

    # --- keys

    async def write_key(self, conn: AsyncConnection) -> tuple[KeyVersion, MasterKey]:
        """The key version new values are encrypted under: the newest registered one.

        Read per write (a handful of rows) so that every coordinator switches to a new version as
        soon as a rotation registers it, without restarting.
        """
        versions = await store.load_key_versions(conn)
        if not versions:
            raise SecretKeyMissing("no key version is registered yet; the node has not finished starting")
        newest = versions[max(versions)]
        key = self.keyring.find(newest.fingerprint)
        if key is None:
            raise SecretKeyMissing(
                f"the cluster's key is version {newest.version} (fingerprint {newest.fingerprint}) and "
                "this node does not hold it: set CONVEYOR_SECRET_KEY(_FILE) to it and restart"
            )
        return newest, key

    def _decrypt(
        self, versions: Mapping[int, KeyVersion], ciphertext: bytes, version: int, identity: str
    ) -> str:
        key = self.keyring.key_for_version(version, versions)
        return decrypt_value(key, ciphertext, identity).decode("utf-8")

    # --- secrets

    async def set_secret(
        self, conn: AsyncConnection, scope: str, name: str, value: str, *, updated_by: str | None
    ) -> SecretWrite:
        """Create or replace a secret (validates scope, name and size; raises `InvalidName`)."""
        parsed = parse_scope(scope)
        check_secret_name(name)
        plaintext = check_secret_value(value)
        version, key = await self.write_key(conn)
        ciphertext = encrypt_value(
            key, plaintext, secret_row_identity(self.org_id, scope, name), self._random_bytes
        )
        now = self._clock()
        existing = await store.find_secret_meta(conn, self.org_id, scope, name)
        created = False
        if existing is None:
            created = await store.insert_secret(
                conn,
                secret_id=new_id(),
                org_id=self.org_id,
                scope=scope,
                name=name,
                ciphertext=ciphertext,
                key_version=version.version,
                at=now,
                updated_by=updated_by,
            )
        if not created:  # existed, or was created concurrently: replace its value
            existing = existing or await store.find_secret_meta(conn, self.org_id, scope, name)
            assert existing is not None
            await store.replace_secret_value(
                conn,
                secret_id=existing.id,
                ciphertext=ciphertext,
                key_version=version.version,
                at=now,
                updated_by=updated_by,
            )
        meta = await store.find_secret_meta(conn, self.org_id, scope, name)
        assert meta is not None
        await _source_changed(conn, parsed.kind, parsed.target)
        return SecretWrite(meta=meta, created=created)

    async def delete_secret(self, conn: AsyncConnection, scope: str, name: str) -> bool:
        """Delete a secret; whether it existed."""
        parsed = parse_scope(scope)
        await _source_changed(conn, parsed.kind, parsed.target)
        return await store.delete_secret(conn, self.org_id, scope, name)

    async def reveal(self, conn: AsyncConnection, scope: str, name: str) -> str | None:
        """The plaintext of one secret (None if absent). For dispatch and ingest, never for a route."""
        row = await store.find_secret(conn, self.org_id, scope, name)
        if row is None:
            return None
        versions = await store.load_key_versions(conn)
        identity = secret_row_identity(row.org_id, row.meta.scope, row.meta.name)
        return self._decrypt(versions, row.ciphertext, row.meta.key_version, identity)

    async def _reveal_scopes(self, conn: AsyncConnection, scopes: tuple[str, ...]) -> list[ScopedValue]:
        rows = await store.secrets_in_scopes(conn, self.org_id, scopes)
        if not rows:
            return []
        versions = await store.load_key_versions(conn)
        return [
            ScopedValue(
                r.meta.scope,
                r.meta.name,
                self._decrypt(
                    versions,
                    r.ciphertext,
                    r.meta.key_version,
                    secret_row_identity(r.org_id, r.meta.scope, r.meta.name),
                ),
            )
            for r in rows
        ]

    async def secrets_for_job(self, conn: AsyncConnection, environment: str | None) -> dict[str, str]:
        """Name → value of every secret a job of `environment` may see (org ∪ env, env wins)."""
        values = await self._reveal_scopes(conn, scopes_visible_to_job(environment))
        return secrets_for_job(values, environment)

    async def source_secrets(self, conn: AsyncConnection, source_id: str) -> dict[str, str]:
        """Name → value of a source's secrets (`webhook_secret`, `webhook_secret_next`, `clone_token`, …)."""
        values = await self._reveal_scopes(conn, (source_scope(source_id),))
        return {v.name: v.value for v in values}

    async def source_secret(self, conn: AsyncConnection, source_id: str, name: str) -> str | None:
        """One secret of a source, e.g. its `webhook_secret` for signature checks."""
        return await self.reveal(conn, source_scope(source_id), name)

    async def set_source_secret(
        self, conn: AsyncConnection, source_id: str, name: str, value: str, *, updated_by: str | None
    ) -> SecretWrite:
        """Store one secret of a source (in the caller's transaction)."""
        return await self.set_secret(conn, source_scope(source_id), name, value, updated_by=updated_by)

    async def delete_source_secrets(self, conn: AsyncConnection, source_id: str) -> int:
        """Delete every secret of a source (when the source is removed)."""
        await _source_changed(conn, "source", source_id)
        return await store.delete_scope(conn, self.org_id, source_scope(source_id))

    # --- encrypted columns of other tables

    async def encrypt_column(
        self, conn: AsyncConnection, table: str, row_id: str, column: str, plaintext: str
    ) -> tuple[bytes, int]:
        """Encrypt a value for `table.column` of row `row_id`; store both returned values in the row.

        The table must also be listed in `store.ENCRYPTED_COLUMNS` so rotation moves it.
        """
        version, key = await self.write_key(conn)
        identity = column_identity(table, row_id, column)
        return encrypt_value(key, plaintext.encode("utf-8"), identity, self._random_bytes), version.version

    async def decrypt_column(
        self, conn: AsyncConnection, table: str, row_id: str, column: str, ciphertext: bytes, key_version: int
    ) -> str:
        """Decrypt a value stored by `encrypt_column`; `SecretIntegrityError` if it was moved or altered."""
        versions = await store.load_key_versions(conn)
        return self._decrypt(versions, ciphertext, key_version, column_identity(table, row_id, column))

    # --- environments and variables

    async def environment(self, conn: AsyncConnection, name: str) -> Environment | None:
        """The stored environment of that name, for `check_environment_for_dispatch`."""
        row = await store.find_environment(conn, self.org_id, name)
        if row is None:
            return None
        return Environment(row.name, dict(row.variables), tuple(row.allowed_branches))

    async def variables_for_job(
        self, conn: AsyncConnection, environment: Environment | None
    ) -> dict[str, str]:
        """Org variables overlaid by the environment's variables."""
        org = await store.org_variable_values(conn, self.org_id)
        return variables_for_job(org, environment.variables if environment else None)


async def _source_changed(conn: AsyncConnection, kind: str, source_id: str | None) -> None:
    """A source's secret changed: every coordinator's webhook source cache drops it at commit."""
    if kind == "source" and source_id:
        await notify(conn, SOURCE_CHANNEL, source_id)


SECRETS = PartKey[SecretService]("secrets")
