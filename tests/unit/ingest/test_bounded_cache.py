"""The bounded cache of ingest (docs/design/execution.md §1.1): entries, bytes and age, each decided purely."""

from __future__ import annotations

from conveyor.ingest.bounded_cache import (
    MISSING,
    BoundedCache,
    CacheBounds,
    evictions,
    fits_alone,
    is_expired,
)
from conveyor.ingest.content_cache import content_size

WIDE = CacheBounds(entries=100, max_bytes=10_000, ttl_ms=60_000)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_evictions_drop_the_least_recently_used_until_count_and_bytes_fit() -> None:
    entries = [("a", 10), ("b", 10), ("c", 10)]
    assert evictions(entries, CacheBounds(entries=3, max_bytes=30, ttl_ms=1)) == []
    assert evictions(entries, CacheBounds(entries=2, max_bytes=30, ttl_ms=1)) == [("a", "entries")]
    assert evictions(entries, CacheBounds(entries=3, max_bytes=15, ttl_ms=1)) == [
        ("a", "bytes"),
        ("b", "bytes"),
    ]
    assert evictions(entries, CacheBounds(entries=0, max_bytes=100, ttl_ms=1)) == [
        ("a", "entries"),
        ("b", "entries"),
        ("c", "entries"),
    ]


def test_an_entry_expires_at_its_ttl_and_one_larger_than_the_cache_is_not_kept() -> None:
    assert not is_expired(10.0, 10.999, 1000)
    assert is_expired(10.0, 11.0, 1000)
    assert fits_alone(100, CacheBounds(entries=1, max_bytes=100, ttl_ms=1))
    assert not fits_alone(101, CacheBounds(entries=1, max_bytes=100, ttl_ms=1))
    assert not fits_alone(0, CacheBounds(entries=0, max_bytes=100, ttl_ms=1))


def test_the_cache_evicts_by_entries_in_lru_order_and_counts_why() -> None:
    cache: BoundedCache[str, str] = BoundedCache("t")
    bounds = CacheBounds(entries=2, max_bytes=10_000, ttl_ms=60_000)
    cache.put("a", "A", 1, bounds)
    cache.put("b", "B", 1, bounds)
    assert cache.get("a", bounds) == "A"  # a is now the most recently used
    cache.put("c", "C", 1, bounds)
    assert cache.get("b", bounds) is MISSING
    assert cache.get("a", bounds) == "A" and cache.get("c", bounds) == "C"
    assert cache.stats["evicted_entries"] == 1 and cache.stats["miss"] == 1 and cache.stats["hit"] == 3


def test_the_cache_evicts_by_bytes_and_keeps_nothing_larger_than_itself() -> None:
    cache: BoundedCache[str, str] = BoundedCache("t")
    bounds = CacheBounds(entries=100, max_bytes=10, ttl_ms=60_000)
    cache.put("a", "A", 6, bounds)
    cache.put("b", "B", 6, bounds)
    assert "a" not in cache and "b" in cache and cache.total_bytes == 6
    cache.put("huge", "H", 11, bounds)
    assert "huge" not in cache and "b" in cache
    assert cache.stats["evicted_bytes"] == 1 and cache.stats["too_large"] == 1


def test_a_lowered_bound_applies_at_the_next_read_or_store() -> None:
    cache: BoundedCache[str, str] = BoundedCache("t")
    for key in "abcd":
        cache.put(key, key, 1, WIDE)
    cache.put("e", "e", 1, CacheBounds(entries=2, max_bytes=10_000, ttl_ms=60_000))
    assert len(cache) == 2 and "d" in cache and "e" in cache
    assert cache.get("e", CacheBounds(entries=0, max_bytes=10_000, ttl_ms=60_000)) is MISSING
    assert len(cache) == 0


def test_an_entry_past_its_ttl_is_a_miss_and_is_dropped() -> None:
    clock = Clock()
    cache: BoundedCache[str, str] = BoundedCache("t", clock=clock)
    bounds = CacheBounds(entries=10, max_bytes=100, ttl_ms=5000)
    cache.put("a", "A", 1, bounds)
    clock.now += 4.9
    assert cache.get("a", bounds) == "A"
    clock.now += 0.1  # five seconds after it was stored; a read does not renew it
    assert cache.get("a", bounds) is MISSING
    assert len(cache) == 0 and cache.total_bytes == 0 and cache.stats["expired"] == 1


def test_storing_a_key_again_replaces_its_size() -> None:
    cache: BoundedCache[str, str] = BoundedCache("t")
    cache.put("a", "A", 5, WIDE)
    cache.put("a", "AA", 7, WIDE)
    assert cache.total_bytes == 7 and cache.get("a", WIDE) == "AA"


def test_content_sizes_count_bytes_and_names() -> None:
    assert content_size(None) == 0
    assert content_size(b"12345") == 5
    assert content_size(["a/b", "é"]) == 4 + 3
