"""`ingest_max_concurrency` (org knob): at most that many of an org's deliveries are processed at once.

The rest wait their turn here, before they take a delivery's lease, so a waiting delivery holds
nothing another coordinator could want; none is dropped. The bound is per coordinator process
(docs/decisions.md): every coordinator admits up to the limit of its own deliveries.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager


def may_enter(active: int, limit: int | None) -> bool:
    """Whether one more delivery of an org with `active` in progress may start (None = unlimited)."""
    return limit is None or active < limit


class OrgGate:
    """Admits deliveries per org up to the org's `ingest_max_concurrency`, read at each admission."""

    def __init__(self, limit: Callable[[str], Awaitable[int | None]]) -> None:
        self._limit = limit
        self._active: dict[str, int] = {}
        self._changed = asyncio.Condition()

    def active(self, org_id: str) -> int:
        """How many of the org's deliveries are being processed now."""
        return self._active.get(org_id, 0)

    @asynccontextmanager
    async def slot(self, org_id: str) -> AsyncIterator[None]:
        """Wait for a free slot of the org, hold it for the block."""
        limit = await self._limit(org_id)
        async with self._changed:
            await self._changed.wait_for(lambda: may_enter(self.active(org_id), limit))
            self._active[org_id] = self.active(org_id) + 1
        try:
            yield
        finally:
            async with self._changed:
                self._active[org_id] -= 1
                self._changed.notify_all()
