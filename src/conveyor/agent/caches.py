"""A cache entry's bytes (docs/design/caches.md §1, §5): the paths a step names, checked against the
workspace and the home directory; the zstd-compressed tar they travel in; its restore; `ctx.hash_files`."""

from __future__ import annotations

import hashlib
import os
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from wcmatch import glob as wcglob

from conveyor.errors import ConveyorError

READ_BYTES = 1024 * 1024
WORKSPACE, HOME = "workspace", "home"
_GLOB_FLAGS = wcglob.GLOBSTAR | wcglob.BRACE | wcglob.DOTGLOB
_HASH_GLOB_FLAGS = _GLOB_FLAGS | wcglob.NODIR


class CachePathError(ConveyorError, ValueError):
    """A path a step named cannot go into a cache entry (the step fails with this message)."""


@dataclass(frozen=True, slots=True)
class Roots:
    """Where entries may read from and restore into."""

    workspace: Path
    home: Path

    def of(self, label: str) -> Path:
        """The directory an archive member's first part names."""
        return self.workspace if label == WORKSPACE else self.home


def _inside(root: Path, candidate: Path) -> bool:
    return candidate == root or root in candidate.parents


def cache_paths(roots: Roots, paths: str | Path | Sequence[str | Path]) -> list[tuple[str, str]]:
    """The `(root label, relative path)` pairs `paths` name, before any glob is expanded.

    A relative path is the workspace's, `~/…` the home's, an absolute path must lie in one of them;
    anything leaving both (`..`, an absolute path elsewhere) raises `CachePathError`.
    """
    entries = [paths] if isinstance(paths, str | Path) else list(paths)
    if not entries:
        raise CachePathError("no paths given")
    found: dict[tuple[str, str], None] = {}
    workspace, home = os.path.normpath(roots.workspace), os.path.normpath(roots.home)
    for entry in entries:
        text = str(entry)
        if not text.strip():
            raise CachePathError("an empty path")
        if text.startswith("~") and text != "~" and not text.startswith("~/"):
            raise CachePathError(f"{text}: only the agent user's own home (~/…) may be cached")
        if text == "~" or text.startswith("~/"):
            absolute = os.path.normpath(os.path.join(home, text[2:]))
        elif os.path.isabs(text):
            absolute = os.path.normpath(text)
        else:
            absolute = os.path.normpath(os.path.join(workspace, text))
        # The workspace may lie under the home; the nearer root names the member.
        for label, root in sorted(((WORKSPACE, workspace), (HOME, home)), key=lambda p: -len(p[1])):
            if absolute == root or absolute.startswith(root + os.sep):
                found[(label, os.path.relpath(absolute, root))] = None
                break
        else:
            raise CachePathError(f"{text}: outside the workspace and the home directory")
    return list(found)


def _members(roots: Roots, pairs: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """The existing paths `pairs` name (globs expanded), as `(label, relative)`; missing ones are skipped."""
    existing: dict[tuple[str, str], None] = {}
    for label, relative in pairs:
        root = roots.of(label)
        if wcglob.is_magic(relative, flags=_GLOB_FLAGS):
            for match in sorted(wcglob.glob(relative, flags=_GLOB_FLAGS, root_dir=str(root))):
                existing[(label, os.path.normpath(match))] = None
        elif os.path.lexists(root / relative):
            existing[(label, relative)] = None
    return list(existing)


def _owned_by_nobody(info: tarfile.TarInfo) -> tarfile.TarInfo:
    # Owners are not kept (docs/design/caches.md §1): the restoring agent's user owns what it restores.
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    # Whole seconds, as tar keeps them: a fractional mtime gives every member a pax header of its own,
    # twice the headers for the restore to parse.
    info.mtime = int(info.mtime)
    return info


def write_archive(roots: Roots, pairs: Sequence[tuple[str, str]], out: BinaryIO) -> int:
    """Write the zstd-compressed pax tar of the existing paths `pairs` name to `out`; how many top-level
    paths went in (0: nothing existed, `out` holds an empty archive). Links are stored, never followed."""
    import zstandard  # here, not at the top: a step that never caches does not load it

    members = _members(roots, pairs)
    writer = zstandard.ZstdCompressor(level=3).stream_writer(out, closefd=False)
    with writer, tarfile.open(fileobj=writer, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for label, relative in members:
            path = roots.of(label) / relative
            if relative == ".":
                for child in sorted(os.listdir(path)):
                    tar.add(path / child, arcname=f"{label}/{child}", filter=_owned_by_nobody)
            else:
                tar.add(path, arcname=f"{label}/{relative}", filter=_owned_by_nobody)
    return len(members)


def restore_archive(roots: Roots, source: BinaryIO) -> int:
    """Extract an entry written by `write_archive` into the workspace and the home; the member count.

    Each member goes under the root its first part names, through `tarfile`'s `tar` filter (no absolute
    names, nothing written outside the root, through a link or otherwise), keeping the mode's permission
    bits; links keep their targets as written (a cached virtualenv's links point outside it).
    """
    import zstandard

    try:
        reader = zstandard.ZstdDecompressor().stream_reader(source, read_size=READ_BYTES, closefd=False)
        return _extract(roots, reader)
    except zstandard.ZstdError as error:
        # A damaged entry reads as a damaged archive: callers handle `tarfile.TarError` alone.
        raise tarfile.ReadError(f"not a zstd stream: {error}") from None


# Regular files up to this size are read whole from the stream and written by the reader itself, or, on a
# machine with CPUs to spare, by a pool of threads, so that creating files overlaps the decompression and
# the parsing of the next headers. Creating a file is CPU work in the kernel (a restore written by the
# reader alone makes no voluntary context switch), so a writer thread only helps with a CPU of its own; and
# every call it makes hands the GIL back and forth (strace of a 5,214-member venv on 2 CPUs: 130,000
# `futex` calls with four writers, 50,000 with two, none inline, and up to 1 s more CPU with four). Two
# CPUs are left to the reader and to the step's and the agent's own processes. Larger files are written in
# order by the reader through `tarfile`.
POOLED_FILE_BYTES = 1024 * 1024


def _writer_threads() -> int:
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        cpus = os.cpu_count() or 1
    return max(0, min(4, cpus - 2))


WRITE_THREADS = _writer_threads()
# What the reader may hold in files not yet written before it waits for the writers.
PENDING_BYTES = 64 * 1024 * 1024


class _Tar(tarfile.TarFile):
    """A tar reader that leaves owners alone."""

    def chown(self, tarinfo: tarfile.TarInfo, targetpath: Any, numeric_owner: bool) -> None:
        # Owners are not kept (docs/design/caches.md §1): what is restored is the agent user's already, and
        # tarfile's chown (as root) looks the archive's empty owner names up for every member.
        pass


class _Writers:
    """Regular files written by a pool of `threads` threads, or by the caller when 0; `drain` waits for all
    and raises the first failure.

    The reader drains before anything that changes which directory a path names (a link) is created, and
    before a second write of a path still pending, so every write lands where the filter checked it would.
    """

    def __init__(self, threads: int) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="cache-restore") if threads else None
        self._pending: dict[str, Any] = {}
        self._bytes = 0

    def submit(self, path: str, data: bytes, mode: int | None, mtime: float) -> None:
        if self._pool is None:
            _write_file(path, data, mode, mtime)
            return
        if path in self._pending or self._bytes + len(data) > PENDING_BYTES:
            self.drain()
        self._pending[path] = self._pool.submit(_write_file, path, data, mode, mtime)
        self._bytes += len(data)

    def drain(self) -> None:
        pending, self._pending, self._bytes = self._pending, {}, 0
        for future in pending.values():
            future.result()

    def close(self) -> None:
        try:
            self.drain()
        finally:
            self.abandon()

    def abandon(self) -> None:
        """After a failure of the reader's: stop, letting running writes end, raising nothing more."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)


_CREATE = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0)


def _write_file(path: str, data: bytes, mode: int | None, mtime: float) -> None:
    # As tarfile writes a member — create or truncate, write, then its permission bits and its mtime — but
    # on the descriptor: five system calls, where `open()` adds an `fstat`, an `ioctl` and an `lseek`, and
    # `chmod`/`utime` by name walk the path again.
    fd = os.open(path, _CREATE, 0o666)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if mode is not None:
            os.fchmod(fd, mode)
        os.utime(fd, (mtime, mtime))
    finally:
        os.close(fd)


class _Destinations:
    """Where a regular file member lands, with `tarfile`'s `tar` filter's containment check at the cost of
    one `lstat` rather than one per path component.

    The real path of each directory is remembered until `forget`, which the reader calls after it extracts
    anything but a regular file or a directory: a link is the only member that changes where a path
    leads (a directory member is made where nothing was, or kept where something already was). A member
    this cannot decide (a leading `/`, a last part `..`, a link in the last part, a directory outside the
    root) is answered None, and the reader takes `tar_filter`'s own path, which refuses or allows it.
    """

    def __init__(self) -> None:
        self._real: dict[str, str] = {}
        self._made: set[str] = set()

    def forget(self) -> None:
        self._real.clear()
        self._made.clear()

    def made(self, directory: str) -> None:
        """`directory` was just extracted (a directory member): its files' `makedirs` is not needed."""
        self._made.add(directory)

    def _realpath(self, path: str) -> str:
        real = self._real.get(path)
        if real is None:
            real = self._real[path] = os.path.realpath(path)
        return real

    def regular_file(self, root: str, name: str) -> str | None:
        """The path to write member `name` to under `root`, its directories made; None: ask the filter."""
        if name.startswith(("/", os.sep)) or os.path.isabs(name):
            return None
        parent, base = os.path.split(name)
        if base in ("", ".", ".."):
            return None
        directory = os.path.join(root, parent) if parent else root
        real_root, real_directory = self._realpath(root), self._realpath(directory)
        if os.path.commonpath([real_root, real_directory]) != real_root:
            return None
        target = os.path.join(directory, base)
        if os.path.islink(target):
            return None
        if directory not in self._made:
            # Its directories first, by the reader, as tarfile makes them (a member's own entry, earlier
            # in the archive, has set their modes).
            os.makedirs(directory, exist_ok=True)
            self._made.add(directory)
        return target


def _extract(roots: Roots, reader: BinaryIO) -> int:
    count = 0
    made: set[Path] = set()
    destinations = _Destinations()
    writers = _Writers(WRITE_THREADS)
    try:
        with reader, _Tar.open(fileobj=reader, mode="r|") as tar:
            for member in tar:
                label, _, rest = member.name.partition("/")
                if label not in (WORKSPACE, HOME) or not rest:
                    raise tarfile.FilterError(f"unexpected member {member.name!r}")
                root = roots.of(label)
                if root not in made:
                    root.mkdir(parents=True, exist_ok=True)
                    made.add(root)
                mode = None if member.mode is None else member.mode & 0o777
                pooled = member.isreg() and member.size <= POOLED_FILE_BYTES
                target = destinations.regular_file(str(root), rest) if pooled else None
                if target is not None:
                    data = tar.extractfile(member).read()  # type: ignore[union-attr]
                    writers.submit(target, data, mode, float(member.mtime))
                    count += 1
                    continue
                local = member.replace(name=rest, deep=False)
                if local.islnk():
                    linked = local.linkname.partition("/")
                    local = local.replace(linkname=linked[2], deep=False)
                checked = tarfile.tar_filter(local, str(root))
                if checked.isreg() and checked.size <= POOLED_FILE_BYTES:
                    target = os.path.join(root, checked.name)
                    data = tar.extractfile(member).read()  # type: ignore[union-attr]
                    os.makedirs(os.path.dirname(target), exist_ok=True)
                    writers.submit(target, data, mode, float(checked.mtime))
                else:
                    if not checked.isdir():
                        writers.drain()
                    tar.extract(
                        checked.replace(mode=mode, uid=os.geteuid(), gid=os.getegid(), deep=False),
                        root,
                        filter="fully_trusted",
                    )
                    if checked.isdir():
                        destinations.made(os.path.join(root, checked.name))
                    elif not checked.isreg():
                        destinations.forget()
                count += 1
    except BaseException:
        writers.abandon()
        raise
    writers.close()
    return count


def restore_timing_text(result: Mapping[str, Any]) -> str | None:
    """The step log's account of where a restore's time went, from the agent's answer; None when the answer
    has no timings (a miss, `run local`, an older agent)."""
    extract = result.get("extract_s")
    if extract is None:
        return None
    download = result.get("download_s")
    if download is None:
        return f"restored from this agent's store: extraction {float(extract):.2f} s"
    return f"downloaded and checked in {float(download):.2f} s, extraction {float(extract):.2f} s"


def hash_files(workspace: Path, globs: Sequence[str]) -> str:
    """SHA-256 over the files the globs match under `workspace`, in relative-path order: each as its
    path, a NUL, its length, a NUL and its bytes (stable across machines and runs)."""
    files: set[str] = set()
    for pattern in globs:
        if not isinstance(pattern, str) or not pattern:
            raise ValueError(f"hash_files: {pattern!r} is not a pattern")
        if os.path.isabs(pattern) or ".." in Path(pattern).parts:
            raise ValueError(f"hash_files: {pattern} must stay inside the workspace")
        files.update(wcglob.glob(pattern, flags=_HASH_GLOB_FLAGS, root_dir=str(workspace)))
    digest = hashlib.sha256()
    for name in sorted(files):
        path = workspace / name
        if not path.is_file():
            continue
        digest.update(Path(name).as_posix().encode("utf-8", "surrogateescape") + b"\0")
        digest.update(str(path.stat().st_size).encode() + b"\0")
        with open(path, "rb") as handle:
            while chunk := handle.read(READ_BYTES):
                digest.update(chunk)
    return digest.hexdigest()
