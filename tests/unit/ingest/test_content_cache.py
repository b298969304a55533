"""The content cache: concurrent reads of one commit share a fetch; failures are shared, never cached."""

from __future__ import annotations

import asyncio

import pytest

from conveyor.ingest.content_cache import ContentCache


async def test_concurrent_reads_of_one_key_share_a_single_fetch() -> None:
    cache = ContentCache[bytes | None]()
    calls = 0
    release = asyncio.Event()

    async def fetch() -> bytes:
        nonlocal calls
        calls += 1
        await release.wait()
        return b"lock"

    readers = [asyncio.create_task(cache.get(("src", "sha"), fetch)) for _ in range(5)]
    await asyncio.sleep(0)  # every reader reaches the cache before the fetch finishes
    release.set()
    assert await asyncio.gather(*readers) == [b"lock"] * 5
    assert calls == 1
    assert await cache.get(("src", "sha"), fetch) == b"lock" and calls == 1


async def test_a_failed_fetch_fails_its_joiners_and_is_not_cached() -> None:
    cache = ContentCache[bytes | None]()
    release = asyncio.Event()
    outcomes = iter([RuntimeError("unreachable"), b"lock"])

    async def fetch() -> bytes:
        await release.wait()
        outcome = next(outcomes)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    first = asyncio.create_task(cache.get(("src", "sha"), fetch))
    joiner = asyncio.create_task(cache.get(("src", "sha"), fetch))
    await asyncio.sleep(0)
    release.set()
    for task in (first, joiner):
        with pytest.raises(RuntimeError, match="unreachable"):
            await task
    assert await cache.get(("src", "sha"), fetch) == b"lock"


async def test_a_joiner_of_a_cancelled_fetch_fetches_for_itself() -> None:
    cache = ContentCache[bytes | None]()
    started = asyncio.Event()
    calls = 0

    async def fetch() -> bytes:
        nonlocal calls
        calls += 1
        if calls == 1:
            started.set()
            await asyncio.Event().wait()  # until cancelled
        return b"lock"

    loader = asyncio.create_task(cache.get(("src", "sha"), fetch))
    await started.wait()
    joiner = asyncio.create_task(cache.get(("src", "sha"), fetch))
    await asyncio.sleep(0)
    loader.cancel()
    assert await asyncio.wait_for(joiner, 10) == b"lock"
    assert calls == 2
    with pytest.raises(asyncio.CancelledError):
        await loader


async def test_a_none_lock_is_cached_like_any_other_value() -> None:
    cache = ContentCache[bytes | None]()
    calls = 0

    async def fetch() -> None:
        nonlocal calls
        calls += 1

    assert await cache.get(("src", "sha"), fetch) is None
    assert await cache.get(("src", "sha"), fetch) is None
    assert calls == 1
