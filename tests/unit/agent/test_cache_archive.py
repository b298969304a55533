"""A cache entry's archive and paths (docs/design/caches.md §1, §5): round trips, refusals, hash_files."""

from __future__ import annotations

import io
import os
import stat
import tarfile
from pathlib import Path

import pytest
import zstandard

from conveyor.agent import caches
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


def test_writing_through_a_link_the_destination_already_had_is_refused(roots: Roots, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (roots.workspace / "out").symlink_to(outside)
    (outside / "kept").write_text("mine")
    (roots.workspace / "file-link").symlink_to(outside / "kept")
    for name in ("workspace/out/pwned", "workspace/file-link"):
        with pytest.raises(tarfile.TarError):
            restore_archive(roots, _archive([(tarfile.TarInfo(name), b"x")]))
    assert sorted(p.name for p in outside.iterdir()) == ["kept"]
    assert (outside / "kept").read_text() == "mine"


def test_a_link_replaced_later_in_the_archive_is_followed_where_it_now_leads(
    roots: Roots, tmp_path: Path
) -> None:
    # Where a directory leads is remembered between members; a link member must make that forgotten, or
    # the second file would be checked against the old link and written through the new one.
    outside = tmp_path / "outside"
    outside.mkdir()
    members = [
        (_member("workspace/d", kind=tarfile.DIRTYPE, mode=0o755), b""),
        (_member("workspace/l", kind=tarfile.SYMTYPE, link="d"), b""),
        (_member("workspace/l/first"), b"inside"),
        (_member("workspace/l", kind=tarfile.SYMTYPE, link=str(outside)), b""),
        (_member("workspace/l/second"), b"x"),
    ]
    with pytest.raises(tarfile.TarError):
        restore_archive(roots, _archive(members))
    assert (roots.workspace / "d" / "first").read_bytes() == b"inside"
    assert list(outside.iterdir()) == []


def test_members_carry_no_pax_header_of_their_own_for_a_fractional_mtime(roots: Roots) -> None:
    # Whole-second mtimes keep ordinary members in plain ustar headers: half the headers to parse.
    (roots.workspace / "pkg").mkdir()
    for i in range(5):
        path = roots.workspace / "pkg" / f"m{i}.py"
        path.write_text("x")
        os.utime(path, (1_600_000_000.25, 1_600_000_000.75))
    out = io.BytesIO()
    write_archive(roots, cache_paths(roots, ["pkg"]), out)
    with tarfile.open(
        fileobj=io.BytesIO(zstandard.ZstdDecompressor().decompressobj().decompress(out.getvalue()))
    ) as tar:
        members = tar.getmembers()
    assert len(members) == 6 and all(m.pax_headers == {} for m in members), [m.pax_headers for m in members]
    assert {m.mtime for m in members if m.isfile()} == {1_600_000_000}


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


def _member(
    name: str, *, kind: bytes = tarfile.REGTYPE, mode: int = 0o644, link: str = ""
) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.linkname, info.mtime = kind, mode, link, 1_600_000_000 + len(name)
    return info


@pytest.mark.parametrize("threads", [0, 2])
def test_files_written_by_the_pool_land_in_archive_order_around_links_and_large_files(
    roots: Roots, monkeypatch: pytest.MonkeyPatch, threads: int
) -> None:
    # Small files go to the writer threads (or are written by the reader, with none); a link, a hard link
    # and a file over the pooled size are made by the reader once the writes before them are done; the
    # last of two members of one path wins.
    monkeypatch.setattr(caches, "WRITE_THREADS", threads)
    monkeypatch.setattr(caches, "POOLED_FILE_BYTES", 1000)
    big = os.urandom(5000)
    small = {f"workspace/tree/d{i % 7}/f{i}": os.urandom(i * 13) for i in range(200)}
    members = [(_member(f"workspace/tree/d{i}", kind=tarfile.DIRTYPE, mode=0o750), b"") for i in range(7)]
    members += [(_member(name, mode=0o640), data) for name, data in small.items()]
    members += [
        (_member("workspace/tree/twice"), b"first"),
        (_member("workspace/tree/link", kind=tarfile.SYMTYPE, link="d1"), b""),
        # Written through the link just made, inside the root: it is d1/through.
        (_member("workspace/tree/link/through"), b"via the link"),
        (_member("workspace/tree/hard", kind=tarfile.LNKTYPE, link="workspace/tree/d3/f3", mode=0o640), b""),
        (_member("workspace/tree/big", mode=0o600), big),
        (_member("workspace/tree/twice", mode=0o600), b"second"),
    ]
    assert restore_archive(roots, _archive(members)) == len(members)
    tree = roots.workspace / "tree"
    for name, data in small.items():
        path = roots.workspace / name.removeprefix("workspace/")
        assert path.read_bytes() == data, name
        assert stat.S_IMODE(path.stat().st_mode) == 0o640
        # (The hard link's member set its own mtime on the inode it shares, as tar does.)
        expected = "workspace/tree/hard" if name == "workspace/tree/d3/f3" else name
        assert path.stat().st_mtime == 1_600_000_000 + len(expected)
    assert stat.S_IMODE((tree / "d2").stat().st_mode) == 0o750
    assert (tree / "twice").read_bytes() == b"second"
    assert stat.S_IMODE((tree / "twice").stat().st_mode) == 0o600
    assert (tree / "d1" / "through").read_bytes() == b"via the link"
    assert os.readlink(tree / "link") == "d1"
    assert (tree / "hard").read_bytes() == small["workspace/tree/d3/f3"]
    assert (tree / "big").read_bytes() == big


@pytest.mark.parametrize("threads", [0, 2])
def test_a_failed_pooled_write_fails_the_restore(
    roots: Roots, monkeypatch: pytest.MonkeyPatch, threads: int
) -> None:
    monkeypatch.setattr(caches, "WRITE_THREADS", threads)
    (roots.workspace / "taken").mkdir()
    members = [(_member("workspace/fine"), b"ok"), (_member("workspace/taken"), b"a directory is here")]
    with pytest.raises(IsADirectoryError):
        restore_archive(roots, _archive(members))


@pytest.mark.parametrize(("cpus", "threads"), [(1, 0), (2, 0), (3, 1), (4, 2), (6, 4), (64, 4)])
def test_writer_threads_only_with_cpus_to_spare(
    monkeypatch: pytest.MonkeyPatch, cpus: int, threads: int
) -> None:
    # Creating files is CPU work in the kernel: on two CPUs writer threads only add GIL handoffs.
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cpus)), raising=False)
    assert caches._writer_threads() == threads


def test_a_pooled_file_is_written_whole_with_its_mode_and_mtime_over_an_existing_one(roots: Roots) -> None:
    (roots.workspace / "f").write_bytes(b"x" * 100_000)
    (roots.workspace / "f").chmod(0o600)
    data = os.urandom(3000)
    assert restore_archive(roots, _archive([(_member("workspace/f", mode=0o751), data)])) == 1
    path = roots.workspace / "f"
    assert path.read_bytes() == data  # truncated, not overwritten in place
    assert stat.S_IMODE(path.stat().st_mode) == 0o751
    assert path.stat().st_mtime == 1_600_000_000 + len("workspace/f")


@pytest.mark.parametrize(
    ("answer", "text"),
    [
        (
            {"kind": "exact", "key": "k", "download_s": 0.2, "extract_s": 2.416},
            "downloaded and checked in 0.20 s, extraction 2.42 s",
        ),
        (
            {"kind": "exact", "key": "k", "extract_s": 4.95},
            "restored from this agent's store: extraction 4.95 s",
        ),
        ({"kind": "partial", "key": "k"}, None),
        ({"kind": "miss", "key": None}, None),
    ],
)
def test_the_restore_timing_line(answer: dict[str, object], text: str | None) -> None:
    assert caches.restore_timing_text(answer) == text
