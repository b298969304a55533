"""The agent's own store of cache entries (docs/design/caches.md §6): entries it restored or saved
recently, named by their SHA-256 under `<home>/caches`, bounded by size, so a hit on the same agent
downloads nothing. Least recently used entries go first."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

DEFAULT_MAX_BYTES = 2 * 1024**3


class EntryStore:
    """Whole, verified entries: a file appears under its digest only by a rename."""

    def __init__(self, directory: Path, max_bytes: int) -> None:
        self.directory = directory
        self.max_bytes = max_bytes

    def find(self, sha256: str) -> Path | None:
        """The stored entry, marked used now; None when this agent has none."""
        path = self.directory / f"{sha256}.tar.zst"
        try:
            os.utime(path)
        except FileNotFoundError:
            return None
        return path

    def keep(self, sha256: str, source: Path) -> None:
        """Move a verified entry (a file on the same file system) into the store, then evict to fit."""
        if source.stat().st_size > self.max_bytes:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        os.replace(source, self.directory / f"{sha256}.tar.zst")
        self._evict()

    def _evict(self) -> None:
        entries = []
        for path in self.directory.glob("*.tar.zst"):
            with contextlib.suppress(FileNotFoundError):
                stat = path.stat()
                entries.append((stat.st_mtime, stat.st_size, path))
        total = sum(size for _, size, _ in entries)
        # Oldest use first; a reader that opened a file keeps reading it after the unlink.
        for _, size, path in sorted(entries):
            if total <= self.max_bytes:
                break
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            total -= size
