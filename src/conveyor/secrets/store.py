"""All SQL of the secrets package: key versions, secrets, environments, org variables, rotation lock.

Values arrive here already encrypted; nothing in this module sees a plaintext secret.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy import Table, and_, delete, func, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.admin.pagination import keyset_page, next_cursor
from conveyor.db.tables import (
    admin_tokens,
    cluster_instances,
    cluster_meta,
    environments,
    org_variables,
    secret_key_versions,
    secrets,
)
from conveyor.model.ids import new_id
from conveyor.secrets.crypto import column_identity, secret_row_identity
from conveyor.secrets.keys import KeyVersion

ROTATION_LOCK_KEY = "secret_rotation_lock"

# --- key versions


async def load_key_versions(conn: AsyncConnection) -> dict[int, KeyVersion]:
    """Every registered key version, by number."""
    rows = await conn.execute(select(secret_key_versions).order_by(secret_key_versions.c.version))
    return {r.version: KeyVersion(r.version, r.fingerprint, r.created_at) for r in rows}


async def insert_key_version(conn: AsyncConnection, version: KeyVersion) -> None:
    """Register a key version (raises IntegrityError when the number or fingerprint is taken)."""
    await conn.execute(
        insert(secret_key_versions).values(
            version=version.version, fingerprint=version.fingerprint, created_at=version.created_at
        )
    )


# --- encrypted cells, for rotation and status


@dataclass(frozen=True)
class EncryptedCell:
    """One encrypted value as rotation sees it: where it lives, its identity and its version."""

    row_id: str
    identity: str
    ciphertext: bytes
    key_version: int


class EncryptedColumn(Protocol):
    """A column of encrypted values that rotation re-encrypts and rotation status counts."""

    @property
    def table_name(self) -> str:
        """The table, as rotation reports it."""
        ...

    async def count_per_version(self, conn: AsyncConnection) -> dict[int, int]:
        """Rows per key version."""
        ...

    async def cells_not_on(
        self, conn: AsyncConnection, version: int, *, after: str | None, limit: int
    ) -> list[EncryptedCell]:
        """Up to `limit` cells whose key version is not `version`, in id order after `after`."""
        ...

    async def replace(
        self, conn: AsyncConnection, cell: EncryptedCell, ciphertext: bytes, version: int
    ) -> bool:
        """Store the re-encrypted value unless the row changed since it was read."""
        ...


class SecretsColumn:
    """`secrets.ciphertext`, whose identity is `secrets:{org_id}:{scope}:{name}`."""

    table_name = "secrets"

    async def count_per_version(self, conn: AsyncConnection) -> dict[int, int]:
        """Rows per key version."""
        rows = await conn.execute(select(secrets.c.key_version, func.count()).group_by(secrets.c.key_version))
        return {int(version): int(count) for version, count in rows}

    async def cells_not_on(
        self, conn: AsyncConnection, version: int, *, after: str | None, limit: int
    ) -> list[EncryptedCell]:
        """Up to `limit` secrets not on `version`, in id order after `after`."""
        query = select(
            secrets.c.id,
            secrets.c.org_id,
            secrets.c.scope,
            secrets.c.name,
            secrets.c.ciphertext,
            secrets.c.key_version,
        ).where(secrets.c.key_version != version)
        if after is not None:
            query = query.where(secrets.c.id > after)
        rows = await conn.execute(query.order_by(secrets.c.id).limit(limit))
        return [
            EncryptedCell(
                r.id, secret_row_identity(r.org_id, r.scope, r.name), bytes(r.ciphertext), r.key_version
            )
            for r in rows
        ]

    async def replace(
        self, conn: AsyncConnection, cell: EncryptedCell, ciphertext: bytes, version: int
    ) -> bool:
        """`UPDATE … WHERE id = ? AND key_version = ?`: a concurrent write wins over rotation."""
        result = await conn.execute(
            update(secrets)
            .where(and_(secrets.c.id == cell.row_id, secrets.c.key_version == cell.key_version))
            .values(ciphertext=ciphertext, key_version=version)
        )
        return bool(result.rowcount)


@dataclass(frozen=True)
class TableColumn:
    """An encrypted column of another table (e.g. a source's webhook secret) with its version column.

    Its identity is `{table}:{id}:{column}`; rows whose value is NULL are skipped.
    """

    table: Table
    value_column: str
    version_column: str
    id_column: str = "id"

    @property
    def table_name(self) -> str:
        """The table, as rotation reports it."""
        return str(self.table.name)

    async def count_per_version(self, conn: AsyncConnection) -> dict[int, int]:
        """Rows per key version (NULL values not counted)."""
        version = self.table.c[self.version_column]
        rows = await conn.execute(
            select(version, func.count())
            .where(self.table.c[self.value_column].is_not(None))
            .group_by(version)
        )
        return {int(v): int(n) for v, n in rows}

    async def cells_not_on(
        self, conn: AsyncConnection, version: int, *, after: str | None, limit: int
    ) -> list[EncryptedCell]:
        """Up to `limit` values not on `version`, in id order after `after`."""
        t, value_col, id_col = self.table, self.table.c[self.value_column], self.table.c[self.id_column]
        query = select(id_col, value_col, t.c[self.version_column]).where(
            and_(value_col.is_not(None), t.c[self.version_column] != version)
        )
        if after is not None:
            query = query.where(id_col > after)
        rows = await conn.execute(query.order_by(id_col).limit(limit))
        return [
            EncryptedCell(
                str(row_id), column_identity(self.table_name, str(row_id), self.value_column), bytes(value), v
            )
            for row_id, value, v in rows
        ]

    async def replace(
        self, conn: AsyncConnection, cell: EncryptedCell, ciphertext: bytes, version: int
    ) -> bool:
        """`UPDATE … WHERE id = ? AND <version> = ?`."""
        t = self.table
        result = await conn.execute(
            update(t)
            .where(and_(t.c[self.id_column] == cell.row_id, t.c[self.version_column] == cell.key_version))
            .values({self.value_column: ciphertext, self.version_column: version})
        )
        return bool(result.rowcount)


SECRETS_COLUMN = SecretsColumn()
# Every encrypted column of the schema. A package that adds one (e.g. sources' webhook secrets)
# lists it here as a `TableColumn`, so rotation moves it and rotation status counts it.
ENCRYPTED_COLUMNS: tuple[EncryptedColumn, ...] = (SECRETS_COLUMN,)


# --- secrets


@dataclass(frozen=True)
class SecretMeta:
    """A secret's metadata: everything but its value."""

    id: str
    scope: str
    name: str
    key_version: int
    created_at: datetime
    updated_at: datetime
    updated_by: str | None
    # Who `updated_by` is, for people: the token's label, else its role and prefix (filled by the routes).
    updated_by_name: str | None = None


@dataclass(frozen=True)
class StoredSecret:
    """A secret row with its ciphertext."""

    meta: SecretMeta
    org_id: str
    ciphertext: bytes


_META_COLUMNS = (
    secrets.c.id,
    secrets.c.scope,
    secrets.c.name,
    secrets.c.key_version,
    secrets.c.created_at,
    secrets.c.updated_at,
    secrets.c.updated_by,
)


def _meta(row: Any) -> SecretMeta:
    m = row._mapping
    return SecretMeta(**{c.name: m[c.name] for c in _META_COLUMNS})


def _stored(row: Any) -> StoredSecret:
    return StoredSecret(meta=_meta(row), org_id=row.org_id, ciphertext=bytes(row.ciphertext))


async def find_secret(conn: AsyncConnection, org_id: str, scope: str, name: str) -> StoredSecret | None:
    """One secret with its ciphertext."""
    row = (
        await conn.execute(
            select(*_META_COLUMNS, secrets.c.org_id, secrets.c.ciphertext).where(
                and_(secrets.c.org_id == org_id, secrets.c.scope == scope, secrets.c.name == name)
            )
        )
    ).first()
    return _stored(row) if row else None


async def secrets_in_scopes(conn: AsyncConnection, org_id: str, scopes: Sequence[str]) -> list[StoredSecret]:
    """Every secret of the given scopes, with ciphertexts."""
    rows = await conn.execute(
        select(*_META_COLUMNS, secrets.c.org_id, secrets.c.ciphertext)
        .where(and_(secrets.c.org_id == org_id, secrets.c.scope.in_(list(scopes))))
        .order_by(secrets.c.scope, secrets.c.name)
    )
    return [_stored(r) for r in rows]


async def insert_secret(
    conn: AsyncConnection,
    *,
    secret_id: str,
    org_id: str,
    scope: str,
    name: str,
    ciphertext: bytes,
    key_version: int,
    at: datetime,
    updated_by: str | None,
) -> bool:
    """Insert a new secret; False (nothing written) when one of that name already exists."""
    try:
        async with conn.begin_nested():
            await conn.execute(
                insert(secrets).values(
                    id=secret_id,
                    org_id=org_id,
                    scope=scope,
                    name=name,
                    ciphertext=ciphertext,
                    key_version=key_version,
                    created_at=at,
                    updated_at=at,
                    updated_by=updated_by,
                )
            )
    except IntegrityError:
        return False
    return True


async def replace_secret_value(
    conn: AsyncConnection,
    *,
    secret_id: str,
    ciphertext: bytes,
    key_version: int,
    at: datetime,
    updated_by: str | None,
) -> None:
    """Store a new value of an existing secret."""
    await conn.execute(
        update(secrets)
        .where(secrets.c.id == secret_id)
        .values(ciphertext=ciphertext, key_version=key_version, updated_at=at, updated_by=updated_by)
    )


async def find_secret_meta(conn: AsyncConnection, org_id: str, scope: str, name: str) -> SecretMeta | None:
    """One secret's metadata."""
    row = (
        await conn.execute(
            select(*_META_COLUMNS).where(
                and_(secrets.c.org_id == org_id, secrets.c.scope == scope, secrets.c.name == name)
            )
        )
    ).first()
    return _meta(row) if row else None


async def delete_secret(conn: AsyncConnection, org_id: str, scope: str, name: str) -> bool:
    """Delete one secret; whether it existed."""
    result = await conn.execute(
        delete(secrets).where(
            and_(secrets.c.org_id == org_id, secrets.c.scope == scope, secrets.c.name == name)
        )
    )
    return bool(result.rowcount)


async def delete_scope(conn: AsyncConnection, org_id: str, scope: str) -> int:
    """Delete every secret of a scope; how many."""
    result = await conn.execute(
        delete(secrets).where(and_(secrets.c.org_id == org_id, secrets.c.scope == scope))
    )
    return int(result.rowcount or 0)


async def page_secrets(
    conn: AsyncConnection, org_id: str, *, scope: str | None, limit: int, cursor: str | None
) -> tuple[list[SecretMeta], str | None]:
    """Secret metadata, newest first, optionally of one scope."""
    filters: Mapping[str, Any] = {"scope": scope}
    query = select(*_META_COLUMNS).where(secrets.c.org_id == org_id)
    if scope is not None:
        query = query.where(secrets.c.scope == scope)
    query = keyset_page(
        query, secrets.c.created_at, secrets.c.id, limit=limit, cursor=cursor, filters=filters
    )
    rows = list(await conn.execute(query))
    following = next_cursor(rows, limit, "created_at", filters)
    return [_meta(r) for r in rows], following


def updater_name(token_id: str, token: Any | None) -> str:
    """How a list names the admin token that updated a row: its label, else its role and prefix; a token
    deleted since is named by its id."""
    if token is None:
        return f"deleted token {token_id}"
    return token.label or f"{token.role} token {token.prefix}…"


async def updater_names(conn: AsyncConnection, token_ids: Iterable[str | None]) -> dict[str, str]:
    """`updater_name` of each admin token id given (one query)."""
    wanted = sorted({token_id for token_id in token_ids if token_id})
    if not wanted:
        return {}
    rows = await conn.execute(
        select(admin_tokens.c.id, admin_tokens.c.label, admin_tokens.c.role, admin_tokens.c.prefix).where(
            admin_tokens.c.id.in_(wanted)
        )
    )
    found = {row.id: row for row in rows}
    return {token_id: updater_name(token_id, found.get(token_id)) for token_id in wanted}


def with_updater_names(metas: Sequence[SecretMeta], names: Mapping[str, str]) -> list[SecretMeta]:
    """`metas` with `updated_by_name` filled from `names`."""
    return [replace(meta, updated_by_name=names.get(meta.updated_by or "")) for meta in metas]


# --- environments


@dataclass(frozen=True)
class EnvironmentRow:
    """A stored environment."""

    id: str
    name: str
    variables: dict[str, str]
    allowed_branches: list[str]
    created_at: datetime
    updated_at: datetime
    # docs/design/approvals.md §1 (None = unprotected).
    protection: dict[str, Any] | None = None


_ENVIRONMENT_COLUMNS = (
    environments.c.id,
    environments.c.name,
    environments.c.variables,
    environments.c.allowed_branches,
    environments.c.created_at,
    environments.c.updated_at,
    environments.c.protection,
)


def _environment(row: Any) -> EnvironmentRow:
    m = row._mapping
    return EnvironmentRow(
        id=m["id"],
        name=m["name"],
        variables=dict(m["variables"] or {}),
        allowed_branches=list(m["allowed_branches"] or []),
        created_at=m["created_at"],
        updated_at=m["updated_at"],
        protection=m["protection"] or None,
    )


async def find_environment(conn: AsyncConnection, org_id: str, name: str) -> EnvironmentRow | None:
    """One environment by name."""
    row = (
        await conn.execute(
            select(*_ENVIRONMENT_COLUMNS).where(
                and_(environments.c.org_id == org_id, environments.c.name == name)
            )
        )
    ).first()
    return _environment(row) if row else None


async def page_environments(
    conn: AsyncConnection, org_id: str, *, limit: int, cursor: str | None
) -> tuple[list[EnvironmentRow], str | None]:
    """Environments, newest first."""
    filters: Mapping[str, Any] = {}
    query = keyset_page(
        select(*_ENVIRONMENT_COLUMNS).where(environments.c.org_id == org_id),
        environments.c.created_at,
        environments.c.id,
        limit=limit,
        cursor=cursor,
        filters=filters,
    )
    rows = list(await conn.execute(query))
    following = next_cursor(rows, limit, "created_at", filters)
    return [_environment(r) for r in rows], following


async def insert_environment(
    conn: AsyncConnection,
    org_id: str,
    name: str,
    *,
    variables: Mapping[str, str],
    allowed_branches: Sequence[str],
    at: datetime,
) -> EnvironmentRow | None:
    """Create an environment; None when one of that name exists already."""
    row = EnvironmentRow(new_id(), name, dict(variables), list(allowed_branches), at, at)
    try:
        async with conn.begin_nested():
            await conn.execute(insert(environments).values(org_id=org_id, **row.__dict__))
    except IntegrityError:
        return None
    return row


async def update_environment(
    conn: AsyncConnection,
    org_id: str,
    name: str,
    *,
    variables: Mapping[str, str],
    allowed_branches: Sequence[str],
    at: datetime,
) -> None:
    """Replace an environment's variables and allowed branches."""
    await conn.execute(
        update(environments)
        .where(and_(environments.c.org_id == org_id, environments.c.name == name))
        .values(variables=dict(variables), allowed_branches=list(allowed_branches), updated_at=at)
    )


async def set_protection(
    conn: AsyncConnection, org_id: str, name: str, protection: Mapping[str, Any] | None, at: datetime
) -> bool:
    """Replace (or, with None, remove) an environment's protection rule; whether the environment exists."""
    result = await conn.execute(
        update(environments)
        .where(and_(environments.c.org_id == org_id, environments.c.name == name))
        .values(protection=dict(protection) if protection is not None else None, updated_at=at)
    )
    return bool(result.rowcount)


async def delete_environment(conn: AsyncConnection, org_id: str, name: str) -> bool:
    """Delete one environment; whether it existed."""
    result = await conn.execute(
        delete(environments).where(and_(environments.c.org_id == org_id, environments.c.name == name))
    )
    return bool(result.rowcount)


# --- org variables


@dataclass(frozen=True)
class VariableRow:
    """An org variable (not secret: its value is shown)."""

    name: str
    value: str
    updated_at: datetime


async def org_variable_values(conn: AsyncConnection, org_id: str) -> dict[str, str]:
    """Every org variable, name → value."""
    rows = await conn.execute(
        select(org_variables.c.name, org_variables.c.value).where(org_variables.c.org_id == org_id)
    )
    return {name: value for name, value in rows}


async def list_variables(conn: AsyncConnection, org_id: str) -> list[VariableRow]:
    """Every org variable, by name."""
    rows = await conn.execute(
        select(org_variables.c.name, org_variables.c.value, org_variables.c.updated_at)
        .where(org_variables.c.org_id == org_id)
        .order_by(org_variables.c.name)
    )
    return [VariableRow(r.name, r.value, r.updated_at) for r in rows]


async def set_variable(conn: AsyncConnection, org_id: str, name: str, value: str, at: datetime) -> bool:
    """Create or replace a variable; True when it was created."""
    result = await conn.execute(
        update(org_variables)
        .where(and_(org_variables.c.org_id == org_id, org_variables.c.name == name))
        .values(value=value, updated_at=at)
    )
    if result.rowcount:
        return False
    try:
        async with conn.begin_nested():
            await conn.execute(
                insert(org_variables).values(org_id=org_id, name=name, value=value, updated_at=at)
            )
    except IntegrityError:  # created concurrently: ours is the later write
        await conn.execute(
            update(org_variables)
            .where(and_(org_variables.c.org_id == org_id, org_variables.c.name == name))
            .values(value=value, updated_at=at)
        )
        return False
    return True


async def delete_variable(conn: AsyncConnection, org_id: str, name: str) -> bool:
    """Delete a variable; whether it existed."""
    result = await conn.execute(
        delete(org_variables).where(and_(org_variables.c.org_id == org_id, org_variables.c.name == name))
    )
    return bool(result.rowcount)


# --- coordinators' advertised keys


async def coordinators_on_other_keys(
    conn: AsyncConnection, fingerprint: str, *, live_since: datetime, except_instance: str | None
) -> list[tuple[str, str]]:
    """Live coordinators advertising a current key other than `fingerprint`: (instance_id, fingerprint)."""
    query = select(cluster_instances.c.instance_id, cluster_instances.c.secret_key_fingerprint).where(
        and_(
            cluster_instances.c.role == "coordinator",
            cluster_instances.c.last_heartbeat_at >= live_since,
            cluster_instances.c.secret_key_fingerprint.is_not(None),
            cluster_instances.c.secret_key_fingerprint != fingerprint,
        )
    )
    if except_instance is not None:
        query = query.where(cluster_instances.c.instance_id != except_instance)
    return [(r.instance_id, r.secret_key_fingerprint) for r in await conn.execute(query)]


async def advertise_key_fingerprint(conn: AsyncConnection, instance_id: str, fingerprint: str) -> bool:
    """Record this node's current key in its `cluster_instances` row, if that row exists."""
    result = await conn.execute(
        update(cluster_instances)
        .where(cluster_instances.c.instance_id == instance_id)
        .values(secret_key_fingerprint=fingerprint)
    )
    return bool(result.rowcount)


# --- rotation lock (a `cluster_meta` row, refreshed by every batch)


async def take_rotation_lock(
    conn: AsyncConnection, holder: str, *, now: datetime, stale_before: datetime
) -> bool:
    """Take the cluster-wide rotation lock; a lock not refreshed since `stale_before` is taken over."""
    await conn.execute(
        delete(cluster_meta).where(
            and_(cluster_meta.c.key == ROTATION_LOCK_KEY, cluster_meta.c.created_at < stale_before)
        )
    )
    try:
        async with conn.begin_nested():
            await conn.execute(
                insert(cluster_meta).values(key=ROTATION_LOCK_KEY, value=holder, created_at=now)
            )
    except IntegrityError:
        return False
    return True


async def refresh_rotation_lock(conn: AsyncConnection, holder: str, now: datetime) -> bool:
    """Still hold the lock (refreshing it); False when another rotation took it over."""
    result = await conn.execute(
        update(cluster_meta)
        .where(and_(cluster_meta.c.key == ROTATION_LOCK_KEY, cluster_meta.c.value == holder))
        .values(created_at=now)
    )
    return bool(result.rowcount)


async def release_rotation_lock(conn: AsyncConnection, holder: str) -> None:
    """Give the lock back."""
    await conn.execute(
        delete(cluster_meta).where(
            and_(cluster_meta.c.key == ROTATION_LOCK_KEY, cluster_meta.c.value == holder)
        )
    )


async def rotation_lock_holder(conn: AsyncConnection) -> str | None:
    """Who holds the rotation lock, if anyone."""
    row = (
        await conn.execute(select(cluster_meta.c.value).where(cluster_meta.c.key == ROTATION_LOCK_KEY))
    ).first()
    return row.value if row else None
