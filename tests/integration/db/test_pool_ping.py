"""A pooled PostgreSQL connection is pinged before use only after sitting idle (`PING_AFTER_IDLE_S`).

A ping on every checkout was a round trip per transaction. These tests kill the pooled connection's
backend (as a server restart would) and check both sides of the trade: a connection idle past the
threshold is pinged and replaced before its transaction; one handed back a moment ago is not pinged, so
its transaction fails, and the pool recovers for the next one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from conveyor.db.engine import Database, is_transient
from tests.support.waiting import async_wait_until


async def _backend_pid(db: Database) -> int:
    async with db.transaction() as conn:
        return int((await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one())


async def _terminate(url: str, pid: int) -> None:
    """End the backend from another connection and wait until it is gone."""
    other = Database.connect(url, pool_size=1)
    try:
        async with other.read() as conn:
            await conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})

        async def gone() -> bool:
            async with other.read() as conn:
                found = await conn.execute(
                    text("SELECT 1 FROM pg_stat_activity WHERE pid = :pid"), {"pid": pid}
                )
                return found.first() is None

        await async_wait_until(gone, timeout=10, what=f"backend {pid} to exit")
    finally:
        await other.dispose()


@pytest.fixture
async def always_pinged(postgres_url: str) -> AsyncIterator[Database]:
    db = Database.connect(postgres_url, pool_size=1, ping_after_idle_s=0.0)
    yield db
    await db.dispose()


@pytest.fixture
async def never_pinged(postgres_url: str) -> AsyncIterator[Database]:
    db = Database.connect(postgres_url, pool_size=1, ping_after_idle_s=3600.0)
    yield db
    await db.dispose()


async def test_a_connection_idle_past_the_threshold_is_pinged_and_replaced_when_dead(
    always_pinged: Database, postgres_url: str
) -> None:
    pid = await _backend_pid(always_pinged)
    await _terminate(postgres_url, pid)
    assert await _backend_pid(always_pinged) != pid


async def test_a_connection_handed_back_a_moment_ago_is_used_unpinged_and_the_pool_recovers(
    never_pinged: Database, postgres_url: str
) -> None:
    pid = await _backend_pid(never_pinged)
    await _terminate(postgres_url, pid)
    with pytest.raises(DBAPIError) as raised:
        await _backend_pid(never_pinged)
    assert raised.value.connection_invalidated
    assert await _backend_pid(never_pinged) != pid


async def test_a_transaction_on_a_terminated_session_fails_transient_so_callers_retry_it(
    never_pinged: Database, postgres_url: str
) -> None:
    # Found by the chaos harness (chaos/replay.py): pg_terminate_backend under an agent's frame closed the
    # agent's connection (1011) instead of retrying, and its started job went back to the queue.
    pid = await _backend_pid(never_pinged)
    await _terminate(postgres_url, pid)
    with pytest.raises(DBAPIError) as raised:
        await _backend_pid(never_pinged)
    assert is_transient(raised.value)
    assert await _backend_pid(never_pinged) != pid  # the retry's new connection works
