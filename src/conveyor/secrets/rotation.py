"""Master-key rotation (docs/design/admin.md §6): register the current key as a new version, re-encrypt every
row.

Re-encryption runs in batches of 500, one transaction each, and each row is written with
`UPDATE … WHERE id = ? AND key_version = ?`, so a value set while rotation runs (already under the
new version) is never overwritten with an older one. It is resumable (an interrupted run leaves rows
on the old version, which the next run picks up) and a rerun with nothing left is a no-op. A
cluster-wide lock row in `cluster_meta`, refreshed by every batch, keeps two rotations apart.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.db.engine import Database
from conveyor.errors import ConveyorError
from conveyor.model.ids import new_id, utc_now
from conveyor.secrets import store
from conveyor.secrets.crypto import SecretIntegrityError, decrypt_value, encrypt_value
from conveyor.secrets.keys import Keyring, KeyVersion
from conveyor.secrets.store import EncryptedCell, EncryptedColumn

BATCH_SIZE = 500
# A rotation lock not refreshed for this long belongs to a crashed run and may be taken over.
LOCK_STALE_AFTER = timedelta(minutes=5)


class RotationRefused(ConveyorError):
    """Rotation cannot run now; `code` is the API error code (409)."""

    code = "conflict"


class KeyMismatch(RotationRefused):
    """A live coordinator advertises another current key: rotating now would strand its writes."""

    code = "key_mismatch"


class RotationInProgress(RotationRefused):
    """Another rotation holds the lock."""

    code = "rotation_in_progress"


class KeyReused(RotationRefused):
    """The current key was retired as an older version; a fresh key is needed."""

    code = "key_reused"


class RotationBlocked(RotationRefused):
    """A row cannot be re-encrypted (its key is not held, or it fails authentication)."""

    code = "rotation_blocked"


@dataclass(frozen=True)
class RotationResult:
    """The answer of `rotate-key`: the target version, rows moved per table, rows left behind."""

    version: int
    reencrypted: dict[str, int]
    remaining: int


@dataclass(frozen=True)
class VersionStatus:
    """Rows per table under one key version, and whether this node holds its key."""

    version: int
    fingerprint: str
    created_at: datetime | None
    rows: dict[str, int]
    total: int
    current: bool
    held: bool


@dataclass(frozen=True)
class RotationStatus:
    """What `secret rotation-status` shows."""

    current_version: int | None
    current_fingerprint: str | None
    node_fingerprint: str
    versions: list[VersionStatus] = field(default_factory=list)
    rows_on_old_versions: int = 0
    in_progress: bool = False


def rotation_target(
    fingerprint: str, versions: Mapping[int, KeyVersion], now: datetime
) -> tuple[KeyVersion, bool]:
    """The version rotation moves rows to, and whether it must be registered first.

    The current key is the target: as version N+1 when it is not yet the newest, as itself when it
    already is (then rotation only finishes an interrupted run, or does nothing).
    """
    if not versions:
        return KeyVersion(1, fingerprint, now), True
    newest = versions[max(versions)]
    if newest.fingerprint == fingerprint:
        return newest, False
    for known in versions.values():
        if known.fingerprint == fingerprint:
            raise KeyReused(
                f"the current key (fingerprint {fingerprint}) was retired as key version {known.version}; "
                "rotate to a freshly generated key instead"
            )
    return KeyVersion(newest.version + 1, fingerprint, now), True


def unreadable_versions(
    keyring: Keyring, versions: Mapping[int, KeyVersion], counts: Mapping[int, int]
) -> list[str]:
    """Descriptions of versions that still have rows but whose key this node does not hold."""
    problems = []
    for version, count in sorted(counts.items()):
        known = versions.get(version)
        if count and (known is None or keyring.find(known.fingerprint) is None):
            fingerprint = known.fingerprint if known else "unregistered"
            problems.append(f"{count} row(s) on key version {version} (fingerprint {fingerprint})")
    return problems


async def _counts(conn: AsyncConnection, columns: Sequence[EncryptedColumn]) -> dict[str, dict[int, int]]:
    return {column.table_name: await column.count_per_version(conn) for column in columns}


async def rotation_status(
    db: Database, keyring: Keyring, columns: Sequence[EncryptedColumn]
) -> RotationStatus:
    """Rows per key version and table; the newest version is current."""
    async with db.read() as conn:
        versions = await store.load_key_versions(conn)
        counts = await _counts(conn, columns)
        in_progress = await store.rotation_lock_holder(conn) is not None
    newest = versions[max(versions)] if versions else None
    every_version = sorted(set(versions) | {v for per in counts.values() for v in per})
    rows: list[VersionStatus] = []
    for version in every_version:
        known = versions.get(version)
        per_table = {table: per.get(version, 0) for table, per in counts.items()}
        rows.append(
            VersionStatus(
                version=version,
                fingerprint=known.fingerprint if known else "unregistered",
                created_at=known.created_at if known else None,
                rows=per_table,
                total=sum(per_table.values()),
                current=newest is not None and version == newest.version,
                held=known is not None and keyring.find(known.fingerprint) is not None,
            )
        )
    return RotationStatus(
        current_version=newest.version if newest else None,
        current_fingerprint=newest.fingerprint if newest else None,
        node_fingerprint=keyring.current.fingerprint,
        versions=rows,
        rows_on_old_versions=sum(r.total for r in rows if not r.current),
        in_progress=in_progress,
    )


async def rotate_to_current_key(
    db: Database,
    keyring: Keyring,
    columns: Sequence[EncryptedColumn],
    *,
    instance_id: str | None,
    live_since: datetime,
    record_start: Callable[[AsyncConnection], Awaitable[None]] | None = None,
    batch_size: int = BATCH_SIZE,
    clock: Callable[[], datetime] = utc_now,
) -> RotationResult:
    """Register the current key as the newest version and re-encrypt every older row under it.

    `record_start` runs inside the transaction that takes the lock and registers the version (the
    route writes its access-log row there, so the row commits before any value moves).
    """
    fingerprint = keyring.current.fingerprint
    async with db.read() as conn:
        others = await store.coordinators_on_other_keys(
            conn, fingerprint, live_since=live_since, except_instance=instance_id
        )
    if others:
        listed = ", ".join(f"{instance} (fingerprint {fp})" for instance, fp in sorted(others))
        raise KeyMismatch(
            f"coordinators advertise another current key: {listed}; give every coordinator the same "
            f"CONVEYOR_SECRET_KEY (fingerprint {fingerprint}) and restart them before rotating"
        )

    holder = new_id()
    async with db.transaction() as conn:
        now = clock()
        if not await store.take_rotation_lock(conn, holder, now=now, stale_before=now - LOCK_STALE_AFTER):
            raise RotationInProgress("another key rotation is running; wait for it to finish")
        versions = await store.load_key_versions(conn)
        target, register = rotation_target(fingerprint, versions, now)
        counts = await _counts(conn, columns)
        merged: dict[int, int] = {}
        for per in counts.values():
            for version, count in per.items():
                if version != target.version:
                    merged[version] = merged.get(version, 0) + count
        problems = unreadable_versions(keyring, versions, merged)
        if problems:
            raise RotationBlocked(
                "cannot re-encrypt "
                + "; ".join(problems)
                + ": set that key as CONVEYOR_SECRET_KEY_OLD(_FILE) "
                "on this node and retry"
            )
        if register:
            await store.insert_key_version(conn, target)
            versions = {**versions, target.version: target}
        if record_start is not None:
            await record_start(conn)

    try:
        moved = {column.table_name: 0 for column in columns}
        for column in columns:
            moved[column.table_name] = await _reencrypt_column(
                db, keyring, column, versions, target, holder, batch_size, clock
            )
    finally:
        async with db.transaction() as conn:
            await store.release_rotation_lock(conn, holder)

    async with db.read() as conn:
        after = await _counts(conn, columns)
    remaining = sum(n for per in after.values() for v, n in per.items() if v != target.version)
    return RotationResult(version=target.version, reencrypted=moved, remaining=remaining)


async def _reencrypt_column(
    db: Database,
    keyring: Keyring,
    column: EncryptedColumn,
    versions: Mapping[int, KeyVersion],
    target: KeyVersion,
    holder: str,
    batch_size: int,
    clock: Callable[[], datetime],
) -> int:
    new_key = keyring.find(target.fingerprint)
    assert new_key is not None  # the target is the current key
    moved = 0
    after: str | None = None
    while True:
        async with db.read() as conn:
            cells = await column.cells_not_on(conn, target.version, after=after, limit=batch_size)
        if not cells:
            return moved
        replacements = [
            (cell, encrypt_value(new_key, _plaintext(keyring, versions, cell), cell.identity))
            for cell in cells
        ]
        async with db.transaction() as conn:
            if not await store.refresh_rotation_lock(conn, holder, clock()):
                raise RotationInProgress("another key rotation took over the lock; this run stopped")
            for cell, ciphertext in replacements:
                if await column.replace(conn, cell, ciphertext, target.version):
                    moved += 1
        after = cells[-1].row_id


def _plaintext(keyring: Keyring, versions: Mapping[int, KeyVersion], cell: EncryptedCell) -> bytes:
    key = keyring.key_for_version(cell.key_version, versions)
    try:
        return decrypt_value(key, cell.ciphertext, cell.identity)
    except SecretIntegrityError as exc:
        raise RotationBlocked(f"{exc}; rotation stopped before this row (earlier rows were moved)") from None
