"""The secrets start-up hook: load the node's keys, check them against the cluster, publish the store.

A node refuses to boot (`FatalStartupError`) when its key is malformed, when it is not the key the
cluster recorded, or when it lacks the key of a version that still has rows; the message names the
variable to set. The first coordinator of an empty database without a configured key generates one
into `$CONVEYOR_HOME/secret.key` (mode 0600) and records its fingerprint as key version 1.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from sqlalchemy.exc import IntegrityError

from conveyor.db.engine import Database
from conveyor.model.ids import utc_now
from conveyor.runtime.node import Component, FatalStartupError, Node, NodeSettings
from conveyor.secrets import store
from conveyor.secrets.crypto import MasterKey
from conveyor.secrets.keys import (
    KeyConfigError,
    Keyring,
    KeyVersion,
    build_keyring,
    check_keyring_fits_cluster,
    generated_key_path,
    read_key_file,
    read_key_setting,
    write_new_key_file,
)
from conveyor.secrets.service import SECRETS, SecretService

log = logging.getLogger(__name__)


class SecretsSettings(NodeSettings, Protocol):
    """What the secrets hook reads of the node's configuration."""

    secret_key: str | None
    secret_key_file: Path | None
    secret_key_old: str | None
    secret_key_old_file: Path | None


class SecretsNode(Node, Protocol):
    """The node as the secrets hook sees it."""

    @property
    def settings(self) -> SecretsSettings: ...


async def start(state: SecretsNode) -> Sequence[Component]:
    """Start-up hook: publish a `SecretService` as `state.parts` (key `SECRETS`) (coordinators only)."""
    if state.settings.cluster_role != "coordinator":
        return []  # workers hold no database and no secret store
    try:
        keyring = await load_keyring(state.db, state.settings)
    except KeyConfigError as exc:
        raise FatalStartupError(str(exc)) from None
    service = SecretService(state.db, keyring)
    state.parts.put(SECRETS, service)
    log.info(
        "secret keys loaded",
        extra={"fingerprint": keyring.current.fingerprint, "old_keys": len(keyring.old)},
    )
    return []


async def advertise(state: SecretsNode) -> Sequence[Component]:
    """Start-up hook, after the runtime core: record this node's key fingerprint in its instance row.

    Separate from `start`, which runs before the identity is settled (webhook verification needs the
    keys while a restarted node waits): the row written then may still be a crashed predecessor's.
    """
    service = state.parts.get(SECRETS)
    instance_id = state.instance_id or state.settings.instance_id
    if not isinstance(service, SecretService) or not instance_id:
        return []
    async with state.db.transaction() as conn:
        await store.advertise_key_fingerprint(conn, instance_id, service.keyring.current.fingerprint)
    return []


async def load_keyring(db: Database, settings: SecretsSettings) -> Keyring:
    """Read the configured (or generated) keys and check them against the database's key versions."""
    current = read_key_setting(settings.secret_key, settings.secret_key_file, variable="CONVEYOR_SECRET_KEY")
    old = read_key_setting(
        settings.secret_key_old, settings.secret_key_old_file, variable="CONVEYOR_SECRET_KEY_OLD"
    )
    async with db.read() as conn:
        versions = await store.load_key_versions(conn)

    generated_path: Path | None = None
    if current is None:
        path = generated_key_path(settings.home)
        if path.exists():
            current = read_key_file(path)
        elif not versions:
            current, generated_path = _generate_key_file(path)
        else:
            newest = versions[max(versions)]
            raise KeyConfigError(
                f"no secret key is configured and the cluster already has one (key version "
                f"{newest.version}, fingerprint {newest.fingerprint}): copy the key file of the first "
                "node (its $CONVEYOR_HOME/secret.key) here and point CONVEYOR_SECRET_KEY_FILE at it"
            )
    keyring = build_keyring(current, [old])

    if not versions:
        # First boot of this database: our key becomes version 1. Racing coordinators agree
        # through the primary key; a loser with another key is refused just below.
        try:
            async with db.transaction() as conn:
                await store.insert_key_version(conn, KeyVersion(1, current.fingerprint, utc_now()))
        except IntegrityError:
            pass
        async with db.read() as conn:
            versions = await store.load_key_versions(conn)

    async with db.read() as conn:
        counts: dict[int, int] = {}
        for column in store.ENCRYPTED_COLUMNS:
            for version, count in (await column.count_per_version(conn)).items():
                counts[version] = counts.get(version, 0) + count
    try:
        check_keyring_fits_cluster(keyring, versions[max(versions)], counts, versions)
    except KeyConfigError:
        if generated_path is not None:
            # We lost the first-boot race: our freshly generated key was never used.
            with contextlib.suppress(OSError):
                generated_path.unlink()
        raise
    return keyring


def _generate_key_file(path: Path) -> tuple[MasterKey, Path | None]:
    """A new key written to `path`, or the one another process sharing this home just wrote."""
    key = MasterKey.generate()
    if write_new_key_file(path, key):
        log.warning(
            "generated a new secret key in %s; back it up, every secret is lost without it",
            path,
            extra={"path": str(path), "fingerprint": key.fingerprint},
        )
        return key, path
    return read_key_file(path), None
