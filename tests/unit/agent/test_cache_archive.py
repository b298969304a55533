"""A cache entry's archive and paths (docs/design/caches.md §1, §5): round trips, refusals, hash_files."""

from __future__ import annotations

import io
import os
import stat
import tarfile
from pathlib import Path

import pytest
import zstandard

from conveyor.agent.caches import (
    CachePathError,
    Roots,
    cache_paths,
    hash_files,
    restore_archive,
    write_archive,
)


@pytest.fixture
def roots(tmp_path: Path) -> Roots:
    home = tmp_path / "home"
    workspace = home / "work" / "src"
    workspace.mkdir(parents=True)
    return Roots(workspace, home)


def test_paths_name_the_workspace_or_the_home(roots: Roots) -> None:
    assert cache_paths(roots, ["deps", "~/.cache/pip", str(roots.workspace / "x"), "~"]) == [
        ("workspace", "deps"),
        ("home", ".cache/pip"),
        ("workspace", "x"),
        ("home", "."),
    ]
    # The workspace lies under the home here: the nearer root names the member.
    assert cache_paths(roots, [str(roots.home / "work" / "src" / "y")]) == [("workspace", "y")]


@pytest.mark.parametrize("path", ["/etc", "../../../elsewhere", "~/../other", "~other/x", ""])
def test_paths_outside_both_roots_are_refused(roots: Roots, path: str) -> None:
    with pytest.raises(CachePathError):
        cache_paths(roots, [path])


def test_symlinks_modes_and_both_roots_round_trip(roots: Roots, tmp_path: Path) -> None:
    deps = roots.workspace / "deps"
    (deps / "sub").mkdir(parents=True)
    (deps / "sub" / "data.bin").write_bytes(os.urandom(70_000))
    (deps / "tool").write_text("#!/bin/sh\n")
    (deps / "tool").chmod(0o750)
    (deps / "sub").chmod(0o710)
    (deps / "link").symlink_to("sub/data.bin")
    (deps / "absolute").symlink_to("/usr/bin/env")
    (roots.home / ".tool").mkdir()
    (roots.home / ".tool" / "x").write_text("home")
    buffer = io.BytesIO()
    pairs = cache_paths(roots, ["deps", "~/.tool", "missing"])
    assert write_archive(roots, pairs, buffer) == 2

    other = Roots(tmp_path / "h2" / "ws", tmp_path / "h2")
    buffer.seek(0)
    assert restore_archive(other, buffer) > 0
    restored = other.workspace / "deps"
    assert (restored / "sub" / "data.bin").read_bytes() == (deps / "sub" / "data.bin").read_bytes()
    assert stat.S_IMODE((restored / "tool").stat().st_mode) == 0o750
    assert stat.S_IMODE((restored / "sub").stat().st_mode) == 0o710
    assert os.readlink(restored / "link") == "sub/data.bin"
    assert os.readlink(restored / "absolute") == "/usr/bin/env"
    assert (other.home / ".tool" / "x").read_text() == "home"


def test_nothing_existing_archives_nothing(roots: Roots) -> None:
    assert write_archive(roots, cache_paths(roots, ["missing", "also/*.txt"]), io.BytesIO()) == 0


def _archive(members: list[tuple[tarfile.TarInfo, bytes]]) -> io.BytesIO:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return io.BytesIO(zstandard.ZstdCompressor().compress(raw.getvalue()))


@pytest.mark.parametrize("name", ["workspace/../../escape", "elsewhere/x", "/workspace/abs"])
def test_a_member_leaving_its_root_is_refused(roots: Roots, name: str) -> None:
    with pytest.raises(tarfile.TarError):
        restore_archive(roots, _archive([(tarfile.TarInfo(name), b"x")]))
    assert not (roots.home.parent / "escape").exists()


def test_writing_through_a_link_out_of_the_root_is_refused(roots: Roots, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    link = tarfile.TarInfo("workspace/out")
    link.type, link.linkname = tarfile.SYMTYPE, str(outside)
    with pytest.raises(tarfile.TarError):
        restore_archive(roots, _archive([(link, b""), (tarfile.TarInfo("workspace/out/pwned"), b"x")]))
    assert not (outside / "pwned").exists()


def test_hash_files_is_stable_and_sees_names_and_contents(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "req.txt").write_text("x==1\n")
    (tmp_path / "b.lock").write_text("y\n")
    first = hash_files(tmp_path, ["**/*.txt", "*.lock"])
    assert first == hash_files(tmp_path, ["*.lock", "**/*.txt", "*.lock"])
    assert len(first) == 64
    (tmp_path / "a" / "req.txt").write_text("x==2\n")
    assert hash_files(tmp_path, ["**/*.txt", "*.lock"]) != first
    (tmp_path / "a" / "req.txt").write_text("x==1\n")
    assert hash_files(tmp_path, ["**/*.txt", "*.lock"]) == first
    (tmp_path / "a" / "req.txt").rename(tmp_path / "a" / "other.txt")
    assert hash_files(tmp_path, ["**/*.txt", "*.lock"]) != first
    assert hash_files(tmp_path, ["nothing*"]) == hash_files(tmp_path, [])
    with pytest.raises(ValueError):
        hash_files(tmp_path, ["../*"])


def test_a_damaged_entry_is_a_tar_error(roots: Roots) -> None:
    with pytest.raises(tarfile.TarError):
        restore_archive(roots, io.BytesIO(b"not zstd at all" * 10))
