"""Key configuration, the keyring's fit with the cluster, and the rotation target (pure)."""

import os
import stat
from datetime import UTC, datetime
from pathlib import Path

import pytest

from conveyor.secrets.crypto import MasterKey
from conveyor.secrets.keys import (
    KeyConfigError,
    KeyVersion,
    SecretKeyMissing,
    build_keyring,
    check_keyring_fits_cluster,
    read_key_setting,
    write_new_key_file,
)
from conveyor.secrets.rotation import KeyReused, rotation_target, unreadable_versions

NOW = datetime(2025, 3, 1, tzinfo=UTC)
A, B = MasterKey.of(b"a" * 32), MasterKey.of(b"b" * 32)


def test_a_key_comes_from_the_variable_or_its_file_but_not_both(tmp_path: Path) -> None:
    path = tmp_path / "key"
    path.write_text(A.as_text() + "\n")
    assert read_key_setting(None, path, variable="CONVEYOR_SECRET_KEY") == A
    assert read_key_setting(A.as_text(), None, variable="CONVEYOR_SECRET_KEY") == A
    assert read_key_setting(None, None, variable="CONVEYOR_SECRET_KEY") is None
    with pytest.raises(KeyConfigError, match="not both"):
        read_key_setting(A.as_text(), path, variable="CONVEYOR_SECRET_KEY")
    with pytest.raises(KeyConfigError, match="CONVEYOR_SECRET_KEY is not a valid master key"):
        read_key_setting("short", None, variable="CONVEYOR_SECRET_KEY")
    with pytest.raises(KeyConfigError, match="cannot read"):
        read_key_setting(None, tmp_path / "missing", variable="CONVEYOR_SECRET_KEY_OLD")


def test_a_generated_key_file_is_created_once_with_mode_0600(tmp_path: Path) -> None:
    path = tmp_path / "home" / "secret.key"
    assert write_new_key_file(path, A)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert not write_new_key_file(path, B)
    assert path.read_text().strip() == A.as_text()


def test_the_keyring_finds_keys_by_version_and_names_a_missing_one() -> None:
    keyring = build_keyring(B, [A, B])
    assert keyring.old == (A,)
    versions = {1: KeyVersion(1, A.fingerprint), 2: KeyVersion(2, B.fingerprint)}
    assert keyring.key_for_version(1, versions) == A
    only_b = build_keyring(B, [])
    with pytest.raises(SecretKeyMissing, match=f"key version 1 \\(fingerprint {A.fingerprint}\\)"):
        only_b.key_for_version(1, versions)
    with pytest.raises(SecretKeyMissing, match="not registered"):
        only_b.key_for_version(7, versions)


def test_a_node_without_the_clusters_key_is_refused_naming_the_key_file_variable() -> None:
    versions = {1: KeyVersion(1, A.fingerprint)}
    with pytest.raises(KeyConfigError, match="CONVEYOR_SECRET_KEY_FILE") as caught:
        check_keyring_fits_cluster(build_keyring(B, []), versions[1], {}, versions)
    assert A.fingerprint in str(caught.value) and B.fingerprint in str(caught.value)
    # During a rotation the new key is current and the cluster's key is the old one: fine.
    check_keyring_fits_cluster(build_keyring(B, [A]), versions[1], {1: 3}, versions)


def test_a_node_missing_the_key_of_a_version_with_rows_is_refused() -> None:
    versions = {1: KeyVersion(1, A.fingerprint), 2: KeyVersion(2, B.fingerprint)}
    with pytest.raises(KeyConfigError, match="CONVEYOR_SECRET_KEY_OLD"):
        check_keyring_fits_cluster(build_keyring(B, []), versions[2], {1: 2, 2: 5}, versions)
    check_keyring_fits_cluster(build_keyring(B, []), versions[2], {1: 0, 2: 5}, versions)


def test_rotation_registers_the_current_key_as_the_next_version_once() -> None:
    assert rotation_target(A.fingerprint, {}, NOW) == (KeyVersion(1, A.fingerprint, NOW), True)
    versions = {1: KeyVersion(1, A.fingerprint)}
    assert rotation_target(B.fingerprint, versions, NOW) == (KeyVersion(2, B.fingerprint, NOW), True)
    assert rotation_target(A.fingerprint, versions, NOW) == (versions[1], False)


def test_rotation_back_to_a_retired_key_is_refused() -> None:
    versions = {1: KeyVersion(1, A.fingerprint), 2: KeyVersion(2, B.fingerprint)}
    with pytest.raises(KeyReused, match="retired as key version 1"):
        rotation_target(A.fingerprint, versions, NOW)


def test_versions_with_rows_but_no_held_key_are_reported() -> None:
    versions = {1: KeyVersion(1, A.fingerprint)}
    assert unreadable_versions(build_keyring(B, []), versions, {1: 4}) == [
        f"4 row(s) on key version 1 (fingerprint {A.fingerprint})"
    ]
    assert unreadable_versions(build_keyring(B, [A]), versions, {1: 4}) == []
