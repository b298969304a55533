"""What an artifact holds (docs/design/artifacts.md §1, §5): the files a step names, checked against its
workspace, and the tar stream they travel in. Pure but for reading the workspace."""

from __future__ import annotations

import os
import tarfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from wcmatch import glob as wcglob

from conveyor.errors import ConveyorError

BLOCK = 512
READ_BYTES = 1024 * 1024
_GLOB_FLAGS = wcglob.GLOBSTAR | wcglob.BRACE | wcglob.DOTGLOB | wcglob.NODIR


class ArtifactPathError(ConveyorError, ValueError):
    """A path a step named cannot go into an artifact (the step fails with this message)."""


@dataclass(frozen=True)
class Selection:
    """The files of one artifact: paths relative to the workspace, in a stable order."""

    files: tuple[str, ...]
    # `file`: exactly one regular file was named by its path; it travels as is.
    format: str

    @property
    def filename(self) -> str | None:
        """The single file's name (a `file` artifact)."""
        return Path(self.files[0]).name if self.format == "file" else None


def _inside(root: Path, candidate: Path) -> bool:
    try:
        candidate.relative_to(root)
    except ValueError:
        return False
    return True


def select_files(root: Path, paths: str | Path | Sequence[str | Path]) -> Selection:
    """The files `paths` name under `root` (files, directories walked, `wcmatch` globs with `**`).

    Raises `ArtifactPathError` for a path outside `root`, a file that does not exist or a pattern that
    matches nothing.
    """
    entries = [paths] if isinstance(paths, str | Path) else list(paths)
    if not entries:
        raise ArtifactPathError("no paths given")
    real_root = root.resolve()
    found: dict[str, None] = {}
    single_file = len(entries) == 1
    for entry in entries:
        text = str(entry)
        if not text.strip():
            raise ArtifactPathError("an empty path")
        if wcglob.is_magic(text, flags=_GLOB_FLAGS):
            if os.path.isabs(text) or ".." in Path(text).parts:
                raise ArtifactPathError(f"{text}: a pattern must stay inside the workspace")
            matches = sorted(wcglob.glob(text, flags=_GLOB_FLAGS, root_dir=str(root)))
            if not matches:
                raise ArtifactPathError(f"{text}: no file matches")
            single_file = False
            for match in matches:
                found[_checked(real_root, root / match, text)] = None
            continue
        target = Path(text) if os.path.isabs(text) else root / text
        relative = _checked(real_root, target, text)
        resolved = target.resolve()
        if resolved.is_dir():
            single_file = False
            for directory, _dirs, names in os.walk(resolved):
                for name in sorted(names):
                    found[_checked(real_root, Path(directory) / name, text)] = None
        elif resolved.is_file():
            found[relative] = None
        else:
            raise ArtifactPathError(f"{text}: no such file or directory")
    if not found:
        raise ArtifactPathError(f"{', '.join(map(str, entries))}: no files (only empty directories)")
    files = tuple(sorted(found))
    return Selection(files, "file" if single_file and len(files) == 1 else "tar")


def _checked(real_root: Path, path: Path, given: str) -> str:
    resolved = path.resolve()
    if not _inside(real_root, resolved):
        raise ArtifactPathError(f"{given}: outside the workspace ({resolved})")
    if not resolved.exists():
        raise ArtifactPathError(f"{given}: no such file or directory")
    return resolved.relative_to(real_root).as_posix()


def tar_blocks(root: Path, files: Sequence[str]) -> Iterator[bytes]:
    """An uncompressed POSIX (pax) tar of `files` (relative to `root`), block by block, never the whole."""
    for name in files:
        path = root / name
        stat = path.stat()
        info = tarfile.TarInfo(name)
        info.size = stat.st_size
        info.mtime = int(stat.st_mtime)
        info.mode = stat.st_mode & 0o777
        yield info.tobuf(format=tarfile.PAX_FORMAT, encoding="utf-8", errors="surrogateescape")
        written = 0
        with open(path, "rb") as handle:
            while written < info.size:
                chunk = handle.read(min(READ_BYTES, info.size - written))
                if not chunk:
                    raise ArtifactPathError(f"{name} shrank while it was uploaded")
                written += len(chunk)
                yield chunk
        if info.size % BLOCK:
            yield b"\0" * (BLOCK - info.size % BLOCK)
    yield b"\0" * (2 * BLOCK)


def file_blocks(path: Path) -> Iterator[bytes]:
    """A single file, 1 MiB at a time."""
    with open(path, "rb") as handle:
        while chunk := handle.read(READ_BYTES):
            yield chunk


def artifact_blocks(root: Path, files: Sequence[str], format: str) -> Iterator[bytes]:
    """The bytes an artifact of `format` holds: its one file as is, else a tar of `files`."""
    return file_blocks(root / files[0]) if format == "file" else tar_blocks(root, files)
