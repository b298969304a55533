"""All SQL of the runtime package: settings rows, instance heartbeats and the leader lease.

Time comes from the database clock. PostgreSQL's `now()` is fixed for a whole transaction, so
reading it once with `database_now` and binding it in every statement of that transaction is the
same as writing `now()` in each one, and lets SQLite (whose single node has one clock anyway) run
the very same statements with the process clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Table, and_, delete, select, text, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.db.tables import cluster_instances, cluster_meta, cluster_settings, leader_lease, org_settings
from conveyor.model.ids import truncate_to_ms, utc_now
from conveyor.model.knobs import CLUSTER_KNOBS_BY_NAME, ORG_KNOBS_BY_NAME

CLUSTER_SETTINGS_ID = "default"
LEASE_NAME = "leader"


async def database_now(conn: AsyncConnection) -> datetime:
    """The database clock: PostgreSQL's transaction time, or this process's clock on SQLite."""
    if conn.dialect.name == "postgresql":
        value = (await conn.execute(text("SELECT now()"))).scalar_one()
        return truncate_to_ms(value)
    return utc_now()


def _insert(conn: AsyncConnection, table: Table) -> Any:
    """A dialect insert that supports ON CONFLICT (both dialects spell it the same way)."""
    return (postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert)(table)


# --- settings rows


@dataclass(frozen=True)
class StoredSettings:
    """A `cluster_settings` or `org_settings` row: version, bookkeeping and knob values (None = unset)."""

    version: int
    updated_at: datetime | None
    updated_by: str | None
    values: Mapping[str, int | None]
    # An org row's policy sources (docs/design/global_workflows.md §1); always empty for the cluster row.
    global_sources: tuple[str, ...] = ()


def _stored(row: Any, names: Sequence[str]) -> StoredSettings:
    mapping = row._mapping
    sources = mapping.get("global_sources")
    return StoredSettings(
        version=int(mapping["version"]),
        updated_at=mapping["updated_at"],
        updated_by=mapping["updated_by"],
        values={name: None if mapping[name] is None else int(mapping[name]) for name in names},
        global_sources=tuple(str(key) for key in sources) if isinstance(sources, list) else (),
    )


async def read_cluster_settings(conn: AsyncConnection) -> StoredSettings | None:
    """The single `cluster_settings` row, or None before the first change."""
    row = (
        await conn.execute(select(cluster_settings).where(cluster_settings.c.id == CLUSTER_SETTINGS_ID))
    ).first()
    return _stored(row, list(CLUSTER_KNOBS_BY_NAME)) if row else None


async def lock_cluster_settings(conn: AsyncConnection) -> StoredSettings:
    """Create the row if needed, then read it locked for this write transaction (`FOR UPDATE`)."""
    await conn.execute(
        _insert(conn, cluster_settings)
        .values(id=CLUSTER_SETTINGS_ID, version=0)
        .on_conflict_do_nothing(index_elements=["id"])
    )
    row = (
        await conn.execute(
            select(cluster_settings).where(cluster_settings.c.id == CLUSTER_SETTINGS_ID).with_for_update()
        )
    ).one()
    return _stored(row, list(CLUSTER_KNOBS_BY_NAME))


async def write_cluster_settings(
    conn: AsyncConnection, values: Mapping[str, int | None], *, version: int, at: datetime, by: str
) -> None:
    """Store every knob value and the new version."""
    await conn.execute(
        update(cluster_settings)
        .where(cluster_settings.c.id == CLUSTER_SETTINGS_ID)
        .values(version=version, updated_at=at, updated_by=by, **dict(values))
    )


async def read_org_settings(conn: AsyncConnection, org_id: str) -> StoredSettings | None:
    """An org's overrides, or None when the org never had a change."""
    row = (await conn.execute(select(org_settings).where(org_settings.c.org_id == org_id))).first()
    return _stored(row, list(ORG_KNOBS_BY_NAME)) if row else None


async def lock_org_settings(conn: AsyncConnection, org_id: str) -> StoredSettings:
    """Create the org's row if needed (first PATCH), then read it locked for this transaction."""
    await conn.execute(
        _insert(conn, org_settings)
        .values(org_id=org_id, version=0)
        .on_conflict_do_nothing(index_elements=["org_id"])
    )
    row = (
        await conn.execute(select(org_settings).where(org_settings.c.org_id == org_id).with_for_update())
    ).one()
    return _stored(row, list(ORG_KNOBS_BY_NAME))


async def write_org_settings(
    conn: AsyncConnection,
    org_id: str,
    values: Mapping[str, int | None],
    *,
    version: int,
    at: datetime,
    by: str,
    global_sources: Sequence[str] = (),
) -> None:
    """Store an org's overrides, its policy sources and its new version."""
    await conn.execute(
        update(org_settings)
        .where(org_settings.c.org_id == org_id)
        .values(
            version=version,
            updated_at=at,
            updated_by=by,
            global_sources=list(global_sources) or None,
            **dict(values),
        )
    )


# --- instances


@dataclass(frozen=True)
class InstanceRow:
    """A `cluster_instances` row."""

    instance_id: str
    boot_id: str
    role: str
    advertise_url: str | None
    software_version: str
    started_at: datetime
    last_heartbeat_at: datetime
    draining: bool
    applied_settings_version: int


_INSTANCE_COLUMNS = (
    cluster_instances.c.instance_id,
    cluster_instances.c.boot_id,
    cluster_instances.c.role,
    cluster_instances.c.advertise_url,
    cluster_instances.c.software_version,
    cluster_instances.c.started_at,
    cluster_instances.c.last_heartbeat_at,
    cluster_instances.c.draining,
    cluster_instances.c.applied_settings_version,
)


def _instance(row: Any) -> InstanceRow:
    values = dict(row._mapping)
    values["draining"] = bool(values["draining"])
    values["applied_settings_version"] = int(values["applied_settings_version"])
    return InstanceRow(**values)


async def read_instance(conn: AsyncConnection, instance_id: str) -> InstanceRow | None:
    """One instance's row."""
    row = (
        await conn.execute(select(*_INSTANCE_COLUMNS).where(cluster_instances.c.instance_id == instance_id))
    ).first()
    return _instance(row) if row else None


async def list_instances(conn: AsyncConnection) -> list[InstanceRow]:
    """Every instance row, by instance id."""
    rows = await conn.execute(select(*_INSTANCE_COLUMNS).order_by(cluster_instances.c.instance_id))
    return [_instance(r) for r in rows]


async def beat_instance(
    conn: AsyncConnection,
    *,
    instance_id: str,
    boot_id: str,
    role: str,
    advertise_url: str | None,
    software_version: str,
    started_at: datetime,
    draining: bool,
    applied_settings_version: int,
) -> datetime:
    """Upsert this node's row with a fresh heartbeat (database clock); return the heartbeat time."""
    now = await database_now(conn)
    values = {
        "boot_id": boot_id,
        "role": role,
        "advertise_url": advertise_url,
        "software_version": software_version,
        "started_at": started_at,
        "last_heartbeat_at": now,
        "draining": draining,
        "applied_settings_version": applied_settings_version,
    }
    await conn.execute(
        _insert(conn, cluster_instances)
        .values(instance_id=instance_id, **values)
        .on_conflict_do_update(index_elements=["instance_id"], set_=values)
    )
    return now


async def delete_instance(conn: AsyncConnection, instance_id: str, boot_id: str) -> None:
    """Remove this process's row (clean shutdown); a successor's row with another boot id stays."""
    await conn.execute(
        delete(cluster_instances).where(
            and_(cluster_instances.c.instance_id == instance_id, cluster_instances.c.boot_id == boot_id)
        )
    )


async def forget_instance(conn: AsyncConnection, instance_id: str, heard_before: datetime) -> bool:
    """Delete a forgotten peer's row, only if it has not beaten since `heard_before`; whether it did."""
    result = await conn.execute(
        delete(cluster_instances).where(
            and_(
                cluster_instances.c.instance_id == instance_id,
                cluster_instances.c.last_heartbeat_at < heard_before,
            )
        )
    )
    return bool(result.rowcount)


# --- leader lease (docs/design/cluster.md §3)


@dataclass(frozen=True)
class LeaseRow:
    """The `leader_lease` row."""

    holder: str
    epoch: int
    acquired_at: datetime
    expires_at: datetime


async def read_lease(conn: AsyncConnection) -> LeaseRow | None:
    """The lease row, live or not."""
    row = (
        await conn.execute(
            select(
                leader_lease.c.holder,
                leader_lease.c.epoch,
                leader_lease.c.acquired_at,
                leader_lease.c.expires_at,
            ).where(leader_lease.c.name == LEASE_NAME)
        )
    ).first()
    if row is None:
        return None
    return LeaseRow(
        holder=row.holder, epoch=int(row.epoch), acquired_at=row.acquired_at, expires_at=row.expires_at
    )


async def acquire_lease(conn: AsyncConnection, holder: str, ttl: timedelta) -> int | None:
    """Take the lease when it is free, expired or already ours; return the new epoch, else None.

    `INSERT … ON CONFLICT DO UPDATE … WHERE expires_at <= now() OR holder = :me RETURNING epoch`:
    one statement, so two coordinators racing for an expired lease cannot both win.
    """
    now = await database_now(conn)
    statement = _insert(conn, leader_lease).values(
        name=LEASE_NAME, holder=holder, epoch=1, acquired_at=now, expires_at=now + ttl
    )
    statement = statement.on_conflict_do_update(
        index_elements=["name"],
        set_={
            "holder": holder,
            "epoch": leader_lease.c.epoch + 1,
            "acquired_at": now,
            "expires_at": now + ttl,
        },
        # `<=`: a lease is live while `expires_at > now` (`_ours`), so one that expires at `now` is free.
        # With `<` a successor acquiring in the very millisecond of a release found it neither.
        where=(leader_lease.c.expires_at <= now) | (leader_lease.c.holder == holder),
    ).returning(leader_lease.c.epoch)
    epoch = (await conn.execute(statement)).scalar_one_or_none()
    return None if epoch is None else int(epoch)


def _ours(holder: str, epoch: int, now: datetime) -> Any:
    return and_(
        leader_lease.c.name == LEASE_NAME,
        leader_lease.c.holder == holder,
        leader_lease.c.epoch == epoch,
        leader_lease.c.expires_at > now,
    )


async def renew_lease(conn: AsyncConnection, holder: str, epoch: int, ttl: timedelta) -> bool:
    """Extend our live lease of this epoch; False when it is no longer ours."""
    now = await database_now(conn)
    result = await conn.execute(
        update(leader_lease).where(_ours(holder, epoch, now)).values(expires_at=now + ttl)
    )
    return result.rowcount == 1


async def release_lease(conn: AsyncConnection, holder: str, epoch: int) -> None:
    """Expire our lease now (clean shutdown) so a successor takes over at its next attempt."""
    now = await database_now(conn)
    await conn.execute(update(leader_lease).where(_ours(holder, epoch, now)).values(expires_at=now))


async def fence_lease(conn: AsyncConnection, holder: str, epoch: int) -> bool:
    """`SELECT 1 … FOR SHARE` on our live lease of this epoch, inside the caller's transaction.

    While this transaction lasts no successor can bump the epoch (its UPDATE waits for the share
    lock), so every write made after a successful fence is made by the rightful leader.
    """
    now = await database_now(conn)
    row = (
        await conn.execute(
            select(leader_lease.c.epoch).where(_ours(holder, epoch, now)).with_for_update(read=True)
        )
    ).first()
    return row is not None


async def limit_lock_wait(conn: AsyncConnection, timeout_ms: int) -> None:
    """PostgreSQL: bound how long this transaction waits for row locks (no-op on SQLite)."""
    if conn.dialect.name == "postgresql":
        await conn.execute(text(f"SET LOCAL lock_timeout = {int(timeout_ms)}"))


async def limit_idle_in_transaction(conn: AsyncConnection, timeout_ms: int) -> None:
    """PostgreSQL: end this session if the transaction sits idle this long (no-op on SQLite).

    A leader frozen inside a fenced transaction holds a share lock on the lease row that would stop
    any successor from taking over; the server ends such a session after one lease TTL.
    """
    if conn.dialect.name == "postgresql":
        await conn.execute(text(f"SET LOCAL idle_in_transaction_session_timeout = {int(timeout_ms)}"))


# --- test hook: fenced writes


async def insert_test_leader_write(conn: AsyncConnection, key: str, value: str) -> None:
    """Record one fenced write of the test-only leader task (a `cluster_meta` row)."""
    await conn.execute(cluster_meta.insert().values(key=key, value=value, created_at=utc_now()))
