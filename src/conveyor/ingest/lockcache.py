"""An LRU of lock files keyed (source, sha): content at a SHA never changes, so entries never expire.

Concurrent reads of one key share a single fetch: a delivery's lock is read ahead while its lease
commits (`DeliveryPipeline._prefetch_lock`), and processing then joins that read instead of fetching
the commit a second time.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable

DEFAULT_ENTRIES = 500

Key = tuple[str, str]


class LockCache:
    """Raw lock bytes (or None for "no lock at this commit") per (source id, sha)."""

    def __init__(self, entries: int = DEFAULT_ENTRIES) -> None:
        self._entries = entries
        self._data: OrderedDict[Key, bytes | None] = OrderedDict()
        # Fetches in flight. A future resolves to the value or to the fetch's error; one whose fetch was
        # cancelled resolves to `_RETRY`, and its waiters then fetch for themselves.
        self._loading: dict[Key, asyncio.Future[bytes | BaseException | object | None]] = {}

    async def get(
        self, source_id: str, sha: str, fetch: Callable[[], Awaitable[bytes | None]]
    ) -> bytes | None:
        """The cached value, else join a fetch in flight, else fetch, remember and return it.

        Errors are not cached; a caller that joined a failed fetch gets its error.
        """
        key = (source_id, sha)
        while True:
            if key in self._data:
                self._data.move_to_end(key)
                return self._data[key]
            loading = self._loading.get(key)
            if loading is None:
                return await self._load(key, fetch)
            outcome = await asyncio.shield(loading)
            if outcome is _RETRY:
                continue
            if isinstance(outcome, BaseException):
                raise outcome
            assert outcome is None or isinstance(outcome, bytes)
            return outcome

    async def _load(self, key: Key, fetch: Callable[[], Awaitable[bytes | None]]) -> bytes | None:
        future: asyncio.Future[bytes | BaseException | object | None] = (
            asyncio.get_running_loop().create_future()
        )
        self._loading[key] = future
        outcome: bytes | BaseException | object | None = _RETRY
        try:
            value = await fetch()
            self._data[key] = value
            if len(self._data) > self._entries:
                self._data.popitem(last=False)
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
        return len(self._data)


_RETRY = object()
