"""The webhook source cache's rules: TTL, invalidation, loads that race an invalidation, its bound."""

from __future__ import annotations

from conveyor.ingest.source_cache import ALL_SOURCES, SourceCache


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def cache(ttl_s: float = 1.0, **options: int) -> tuple[SourceCache, Clock]:
    clock = Clock()
    return SourceCache(ttl_s, clock=clock, **options), clock


def test_an_entry_is_served_until_the_ttl_then_dropped() -> None:
    sources, clock = cache(1.0)
    assert sources.put("s1", None, ("secret",), sources.begin_load())
    clock.now += 0.999
    entry = sources.get("s1")
    assert entry is not None and entry.secrets == ("secret",)
    clock.now += 0.001
    assert sources.get("s1") is None
    assert len(sources) == 0


def test_invalidating_one_source_keeps_the_others() -> None:
    sources, _ = cache()
    for name in ("s1", "s2"):
        sources.put(name, None, (name,), sources.begin_load())
    sources.invalidate("s1")
    assert sources.get("s1") is None
    assert sources.get("s2") is not None


def test_invalidating_all_drops_everything() -> None:
    sources, _ = cache()
    for name in ("s1", "s2"):
        sources.put(name, None, (name,), sources.begin_load())
    sources.invalidate(ALL_SOURCES)
    assert len(sources) == 0


def test_a_load_that_raced_an_invalidation_is_not_kept() -> None:
    sources, _ = cache()
    token = sources.begin_load()
    sources.invalidate("other")  # any change while the load read the database
    assert not sources.put("s1", None, ("old",), token)
    assert sources.get("s1") is None
    assert sources.put("s1", None, ("new",), sources.begin_load())


def test_a_zero_ttl_caches_nothing() -> None:
    sources, _ = cache(0)
    assert not sources.put("s1", None, ("x",), sources.begin_load())
    assert sources.get("s1") is None


def test_the_least_recently_used_entry_goes_past_the_bound() -> None:
    sources, _ = cache(max_entries=2)
    sources.put("a", None, (), sources.begin_load())
    sources.put("b", None, (), sources.begin_load())
    assert sources.get("a") is not None  # "a" is now the most recently used
    sources.put("c", None, (), sources.begin_load())
    assert sources.get("b") is None
    assert sources.get("a") is not None and sources.get("c") is not None
