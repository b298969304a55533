"""A cache bounded by entries, bytes and age (docs/design/execution.md §1.1): the content and lock-file caches.

The decisions (what has expired, what to evict to fit the bounds) are pure functions of plain values;
`BoundedCache` only keeps the entries in least-recently-used order and applies them. Bounds are passed to
each call, so a changed cluster knob applies at the next read without a restart. Every key this
cache is used with names immutable content (a commit id, a lock file's SHA-256), so an entry is never
stale: the TTL only bounds how long memory is held for content nobody asks for.
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


@dataclass(frozen=True)
class CacheBounds:
    """At most `entries` entries (0: cache nothing), `max_bytes` bytes in all, each kept `ttl_ms` at most."""

    entries: int
    max_bytes: int
    ttl_ms: int


def is_expired(stored_at_s: float, now_s: float, ttl_ms: int) -> bool:
    """Whether an entry stored at `stored_at_s` is past its TTL at `now_s` (monotonic seconds)."""
    return (now_s - stored_at_s) * 1000 >= ttl_ms


def fits_alone(size: int, bounds: CacheBounds) -> bool:
    """Whether an entry of `size` bytes may be kept at all (one larger than the whole cache is not)."""
    return bounds.entries > 0 and size <= bounds.max_bytes


def evictions(lru_first: Sequence[tuple[K, int]], bounds: CacheBounds) -> list[tuple[K, str]]:
    """The entries to drop, least recently used first, so that the rest fit `bounds`; each with its reason.

    `lru_first` is every entry as (key, size), least recently used first. The reason is `entries` when
    the count was over its bound at that drop, else `bytes`.
    """
    count = len(lru_first)
    total = sum(size for _, size in lru_first)
    dropped: list[tuple[K, str]] = []
    for key, size in lru_first:
        if count <= bounds.entries and total <= bounds.max_bytes:
            break
        dropped.append((key, "entries" if count > bounds.entries else "bytes"))
        count -= 1
        total -= size
    return dropped


@dataclass
class _Entry(Generic[V]):
    value: V
    size: int
    stored_at_s: float


MISSING = object()


class BoundedCache(Generic[K, V]):
    """Entries in least-recently-used order; `stats` counts hits, misses and evictions by reason."""

    def __init__(self, name: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self.clock = clock
        self._data: OrderedDict[K, _Entry[V]] = OrderedDict()
        self._bytes = 0
        # hit, miss, expired, evicted_entries, evicted_bytes, too_large
        self.stats: Counter[str] = Counter()

    def get(self, key: K, bounds: CacheBounds) -> V | object:
        """The value kept under `key`, or `MISSING` (an expired entry is dropped and counts as a miss).

        Bounds lowered since the last store apply first.
        """
        if len(self._data) > bounds.entries or self._bytes > bounds.max_bytes:
            self._evict(bounds)
        entry = self._data.get(key)
        if entry is not None and is_expired(entry.stored_at_s, self.clock(), bounds.ttl_ms):
            self._drop(key)
            self.stats["expired"] += 1
            entry = None
        if entry is None:
            self.stats["miss"] += 1
            return MISSING
        self._data.move_to_end(key)
        self.stats["hit"] += 1
        return entry.value

    def put(self, key: K, value: V, size: int, bounds: CacheBounds) -> None:
        """Keep `value` (of `size` bytes) unless it alone passes the bounds, then evict to fit them."""
        if key in self._data:
            self._drop(key)
        if not fits_alone(size, bounds):
            self.stats["too_large"] += 1
        else:
            self._data[key] = _Entry(value, size, self.clock())
            self._bytes += size
        self._evict(bounds)

    def _evict(self, bounds: CacheBounds) -> None:
        order = [(k, entry.size) for k, entry in self._data.items()]
        for dropped, reason in evictions(order, bounds):
            self._drop(dropped)
            self.stats[f"evicted_{reason}"] += 1

    def _drop(self, key: K) -> None:
        entry = self._data.pop(key)
        self._bytes -= entry.size

    @property
    def total_bytes(self) -> int:
        """The bytes the kept entries count for."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        return key in self._data
