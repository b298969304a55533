"""Master keys of a node: where they come from, the keyring, and whether they fit the cluster.

Keys come from `CONVEYOR_SECRET_KEY[_FILE]` (current) and `CONVEYOR_SECRET_KEY_OLD[_FILE]` (during a
rotation), or, with neither set, from `$CONVEYOR_HOME/secret.key`, which the first coordinator of an
empty database generates (mode 0600). The database records each key by fingerprint as a numbered
version (`secret_key_versions`); the newest version is the cluster's key, which every coordinator
must hold. The checks here are pure; `startup.py` does the reading and writing around them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from conveyor.errors import ConveyorError
from conveyor.secrets.crypto import InvalidMasterKey, MasterKey, parse_master_key

GENERATED_KEY_FILE = "secret.key"


class KeyConfigError(ConveyorError):
    """The node's key configuration cannot work; the message names the variable to fix."""


class SecretKeyMissing(ConveyorError):
    """A stored value is encrypted under a key version whose key this node does not hold."""


@dataclass(frozen=True)
class KeyVersion:
    """One row of `secret_key_versions`."""

    version: int
    fingerprint: str
    created_at: datetime | None = None


@dataclass(frozen=True)
class Keyring:
    """The keys this node holds: the current one, and old ones while a rotation is under way."""

    current: MasterKey
    old: tuple[MasterKey, ...] = ()

    @property
    def fingerprints(self) -> tuple[str, ...]:
        """Fingerprints of every held key, current first."""
        return (self.current.fingerprint, *(k.fingerprint for k in self.old))

    def find(self, fingerprint: str) -> MasterKey | None:
        """The held key with this fingerprint, if any."""
        for key in (self.current, *self.old):
            if key.fingerprint == fingerprint:
                return key
        return None

    def key_for_version(self, version: int, versions: Mapping[int, KeyVersion]) -> MasterKey:
        """The key that decrypts rows of `version`; `SecretKeyMissing` names it, never guesses."""
        known = versions.get(version)
        if known is None:
            raise SecretKeyMissing(f"key version {version} is not registered in secret_key_versions")
        key = self.find(known.fingerprint)
        if key is None:
            raise SecretKeyMissing(
                f"key version {version} (fingerprint {known.fingerprint}) is not configured on this "
                "node: set it as CONVEYOR_SECRET_KEY_OLD (or _FILE) until `secret rotate-key` has moved "
                "every row off it"
            )
        return key


def read_key_setting(value: str | None, file: Path | None, *, variable: str) -> MasterKey | None:
    """One key from `VARIABLE` or `VARIABLE_FILE` (not both); None when neither is set."""
    if value and file:
        raise KeyConfigError(f"set {variable} or {variable}_FILE, not both")
    if file:
        return read_key_file(file, origin=f"{variable}_FILE ({file})")
    if value:
        try:
            return parse_master_key(value, origin=variable)
        except InvalidMasterKey as exc:
            raise KeyConfigError(str(exc)) from None
    return None


def read_key_file(path: Path, *, origin: str | None = None) -> MasterKey:
    """A key from a file holding 64 hex characters or base64 of 32 bytes."""
    origin = origin or str(path)
    try:
        text = path.read_text(encoding="ascii", errors="strict")
    except (OSError, UnicodeDecodeError) as exc:
        raise KeyConfigError(f"cannot read the secret key {origin}: {exc}") from None
    try:
        return parse_master_key(text, origin=origin)
    except InvalidMasterKey as exc:
        raise KeyConfigError(str(exc)) from None


def generated_key_path(home: Path) -> Path:
    """Where a node keeps the key it generated."""
    return home / GENERATED_KEY_FILE


def write_new_key_file(path: Path, key: MasterKey) -> bool:
    """Create `path` with mode 0600 holding `key`; False when the file already exists."""
    return write_new_private_file(path, key.as_text() + "\n")


def write_new_private_file(path: Path, text: str) -> bool:
    """Create `path` with mode 0600 holding `text` (ASCII: a key); False when the file already exists.

    O_EXCL makes two processes sharing a home agree on one file, and the mode is set at creation
    so the key is never readable by others, not even briefly. The provenance signing key is written
    here too (docs/design/artifacts.md §9).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return False
    try:
        os.write(fd, text.encode("ascii"))
        os.fsync(fd)
    finally:
        os.close(fd)
    return True


def build_keyring(current: MasterKey, old: Sequence[MasterKey | None]) -> Keyring:
    """A keyring, dropping old keys that repeat the current one."""
    extra: list[MasterKey] = []
    for key in old:
        if key is not None and key.fingerprint != current.fingerprint and key not in extra:
            extra.append(key)
    return Keyring(current=current, old=tuple(extra))


def check_keyring_fits_cluster(
    keyring: Keyring,
    newest: KeyVersion,
    rows_per_version: Mapping[int, int],
    versions: Mapping[int, KeyVersion],
) -> None:
    """Refuse a node that could not read or write the cluster's secrets (`KeyConfigError`).

    The node must hold the newest version's key (writes use it) and the key of every version that
    still has rows (reads need it).
    """
    if keyring.find(newest.fingerprint) is None:
        raise KeyConfigError(
            f"this node's secret key (fingerprint {keyring.current.fingerprint}) is not the cluster's "
            f"(key version {newest.version}, fingerprint {newest.fingerprint}): every coordinator needs "
            "the same key; copy the key file of the first node (its $CONVEYOR_HOME/secret.key) here and "
            "point CONVEYOR_SECRET_KEY_FILE at it, or set CONVEYOR_SECRET_KEY to that key"
        )
    for version, count in sorted(rows_per_version.items()):
        if count == 0:
            continue
        known = versions.get(version)
        if known is None or keyring.find(known.fingerprint) is None:
            fingerprint = known.fingerprint if known else "unregistered"
            raise KeyConfigError(
                f"{count} encrypted value(s) use key version {version} (fingerprint {fingerprint}), "
                "which this node does not hold: set that key as CONVEYOR_SECRET_KEY_OLD_FILE (or "
                "CONVEYOR_SECRET_KEY_OLD) and run `conveyor admin secret rotate-key`"
            )
