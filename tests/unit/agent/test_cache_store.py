"""The agent's store of cache entries (docs/design/caches.md §6): found by digest, bounded by size, the
least recently used going first."""

from __future__ import annotations

import os
from pathlib import Path

from conveyor.agent.cache_store import EntryStore


def entry(tmp_path: Path, name: str, size: int) -> Path:
    path = tmp_path / f"incoming-{name}"
    path.write_bytes(b"x" * size)
    return path


def test_entries_are_found_by_digest_and_the_least_recently_used_go_first(tmp_path: Path) -> None:
    store = EntryStore(tmp_path / "caches", max_bytes=250)
    store.keep("a", entry(tmp_path, "a", 100))
    store.keep("b", entry(tmp_path, "b", 100))
    # Make the order of use explicit: b is older than a, whatever the file system's clock resolution.
    os.utime(tmp_path / "caches" / "b.tar.zst", (1_000, 1_000))
    os.utime(tmp_path / "caches" / "a.tar.zst", (2_000, 2_000))
    store.keep("c", entry(tmp_path, "c", 100))
    assert store.find("b") is None
    assert store.find("a") is not None and store.find("c") is not None
    assert store.find("missing") is None


def test_an_entry_larger_than_the_store_is_not_kept_and_evicts_nothing(tmp_path: Path) -> None:
    store = EntryStore(tmp_path / "caches", max_bytes=150)
    store.keep("a", entry(tmp_path, "a", 100))
    store.keep("big", entry(tmp_path, "big", 200))
    assert store.find("big") is None and store.find("a") is not None
    assert (tmp_path / "incoming-big").exists()  # left where it was: the caller removes its file
