"""Each coordinator's cache of webhook sources and their signing secrets (the webhook route's hot path).

A webhook needs its source row and the source's `webhook_secret` / `webhook_secret_next` before anything
is stored; reading them costs several statements per request. The cache keeps them per source id for at
most `ttl_s` (the fallback bound), and drops an entry as soon as a change is committed: writers send
`notify(SOURCE_CHANNEL, source_id)` (`conveyor.db.channels`) in their transaction, which reaches every coordinator through
PostgreSQL's LISTEN and this process through `Database.on_commit_notify` (SQLite too).

A load that was in flight when an invalidation arrived is not stored: it may have read the old row.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from conveyor.ingest.providers.base import SourceRow

ALL_SOURCES = "*"  # a payload that drops every entry (e.g. after the listener reconnected)
DEFAULT_TTL_MS = 1000
MAX_ENTRIES = 4096


@dataclass(frozen=True)
class CachedSource:
    """A source (None: no such source) and its webhook secrets, current first."""

    source: SourceRow | None
    secrets: tuple[str, ...]
    loaded_at: float


class SourceCache:
    """Source id → `CachedSource`, least recently used dropped past `max_entries`."""

    def __init__(
        self,
        ttl_s: float = DEFAULT_TTL_MS / 1000,
        *,
        max_entries: int = MAX_ENTRIES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self.clock = clock
        self._entries: OrderedDict[str, CachedSource] = OrderedDict()
        self._generation = 0

    def get(self, source_id: str) -> CachedSource | None:
        """The entry if it is younger than the TTL, else None (and a stale one is dropped)."""
        entry = self._entries.get(source_id)
        if entry is None:
            return None
        if self.ttl_s <= 0 or self.clock() - entry.loaded_at >= self.ttl_s:
            del self._entries[source_id]
            return None
        self._entries.move_to_end(source_id)
        return entry

    def begin_load(self) -> int:
        """A token for a load about to read the database; pass it to `put`."""
        return self._generation

    def put(self, source_id: str, source: SourceRow | None, secrets: tuple[str, ...], token: int) -> bool:
        """Keep what a load read, unless an invalidation arrived since `begin_load`; whether it was kept."""
        if token != self._generation or self.ttl_s <= 0:
            return False
        self._entries[source_id] = CachedSource(source, secrets, self.clock())
        self._entries.move_to_end(source_id)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
        return True

    def invalidate(self, source_id: str = ALL_SOURCES) -> None:
        """Drop one source's entry (or all with `ALL_SOURCES`) and void every load in flight."""
        self._generation += 1
        if source_id == ALL_SOURCES:
            self._entries.clear()
        else:
            self._entries.pop(source_id, None)

    def __len__(self) -> int:
        return len(self._entries)
