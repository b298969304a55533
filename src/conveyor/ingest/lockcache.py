"""An LRU of lock files keyed (source, sha): content at a SHA never changes, so entries never expire."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable

DEFAULT_ENTRIES = 500


class LockCache:
    """Raw lock bytes (or None for "no lock at this commit") per (source id, sha)."""

    def __init__(self, entries: int = DEFAULT_ENTRIES) -> None:
        self._entries = entries
        self._data: OrderedDict[tuple[str, str], bytes | None] = OrderedDict()

    async def get(
        self, source_id: str, sha: str, fetch: Callable[[], Awaitable[bytes | None]]
    ) -> bytes | None:
        """The cached value, else fetch, remember and return it (errors are not cached)."""
        key = (source_id, sha)
        if key in self._data:
            self._data.move_to_end(key)
            return self._data[key]
        value = await fetch()
        self._data[key] = value
        if len(self._data) > self._entries:
            self._data.popitem(last=False)
        return value

    def __len__(self) -> int:
        return len(self._data)
