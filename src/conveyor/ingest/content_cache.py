"""The content cache: what a coordinator fetched from repositories, keyed by immutable ids
(docs/design/execution.md §1.1).

Keys name content that never changes (a lock file at a commit id, the files changed between two commit
ids), so an entry is never stale; `content_cache_max`, `content_cache_max_bytes` and
`content_cache_ttl_ms` bound the memory it holds (`bounded_cache`). Concurrent reads of one key share a
single fetch: a delivery's lock is read ahead while its lease commits (`DeliveryPipeline._prefetch_lock`),
and processing then joins that read instead of fetching the commit a second time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

from conveyor.ingest.bounded_cache import MISSING, BoundedCache, CacheBounds

V = TypeVar("V")

# Bounds of a cache built without knobs (unit tests, tools): the knobs' built-in defaults.
DEFAULT_BOUNDS = CacheBounds(entries=1000, max_bytes=64 * 1024 * 1024, ttl_ms=3_600_000)


def content_size(value: object) -> int:
    """The bytes a cached value counts for: bytes as is, a list of names their UTF-8 bytes plus one each."""
    if value is None:
        return 0
    if isinstance(value, bytes):
        return len(value)
    if isinstance(value, list):
        return sum(len(str(item).encode()) + 1 for item in value)
    raise TypeError(f"no size for a cached {type(value).__name__}")


class ContentCache(Generic[V]):
    """Fetched content per immutable key, bounded; fetches of one key in flight are shared."""

    def __init__(self, name: str = "content") -> None:
        self.entries: BoundedCache[Hashable, V] = BoundedCache(name)
        # Fetches in flight. A future resolves to the value or to the fetch's error; one whose fetch was
        # cancelled resolves to `_RETRY`, and its waiters then fetch for themselves.
        self._loading: dict[Hashable, asyncio.Future[object]] = {}

    async def get(
        self, key: Hashable, fetch: Callable[[], Awaitable[V]], bounds: CacheBounds = DEFAULT_BOUNDS
    ) -> V:
        """The cached value, else join a fetch in flight, else fetch, remember and return it.

        Errors are not cached; a caller that joined a failed fetch gets its error.
        """
        while True:
            found = self.entries.get(key, bounds)
            if found is not MISSING:
                return found  # type: ignore[return-value]
            loading = self._loading.get(key)
            if loading is None:
                return await self._load(key, fetch, bounds)
            outcome = await asyncio.shield(loading)
            if outcome is _RETRY:
                continue
            if isinstance(outcome, BaseException):
                raise outcome
            return outcome  # type: ignore[return-value]

    async def _load(self, key: Hashable, fetch: Callable[[], Awaitable[V]], bounds: CacheBounds) -> V:
        future: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        self._loading[key] = future
        outcome: object = _RETRY
        try:
            value = await fetch()
            self.entries.put(key, value, content_size(value), bounds)
            outcome = value
            return value
        except Exception as error:
            outcome = error
            raise
        finally:
            # Cancelled (or stopped by a BaseException): waiters fetch for themselves.
            del self._loading[key]
            future.set_result(outcome)

    def __len__(self) -> int:
        return len(self.entries)


_RETRY = object()
