"""The leader lease on both dialects (docs/design/cluster.md §3): acquisition, renewal, fencing, leader
tasks."""

import asyncio
from datetime import timedelta

import pytest
from sqlalchemy import select, update

from conveyor.db.engine import Database
from conveyor.db.tables import cluster_meta, leader_lease
from conveyor.runtime import store
from conveyor.runtime.lease import LeaderContext, Leadership, LeaderTask, LeaseLost
from tests.support.waiting import async_wait_until


async def now_true(value: bool) -> bool:
    return value


TTL = timedelta(milliseconds=1500)


async def acquire(db: Database, holder: str, ttl: timedelta = TTL) -> int | None:
    async with db.transaction() as conn:
        return await store.acquire_lease(conn, holder, ttl)


async def expire_lease(db: Database) -> None:
    """Age the lease past its expiry without waiting (as a frozen holder's lease would be)."""
    async with db.transaction() as conn:
        lease = await store.read_lease(conn)
        assert lease is not None
        await conn.execute(update(leader_lease).values(expires_at=lease.expires_at - timedelta(minutes=5)))


async def test_the_first_node_gets_epoch_one_and_a_second_cannot_take_a_live_lease(
    database: Database,
) -> None:
    assert await acquire(database, "a") == 1
    assert await acquire(database, "b") is None


async def test_an_expired_lease_goes_to_the_next_node_with_a_higher_epoch(database: Database) -> None:
    assert await acquire(database, "a") == 1
    await expire_lease(database)
    assert await acquire(database, "b") == 2
    async with database.read() as conn:
        lease = await store.read_lease(conn)
    assert lease is not None and (lease.holder, lease.epoch) == ("b", 2)


async def test_the_holder_reacquiring_bumps_the_epoch(database: Database) -> None:
    assert await acquire(database, "a") == 1
    assert await acquire(database, "a") == 2


async def test_renewal_and_fence_hold_only_for_the_current_epoch(database: Database) -> None:
    assert await acquire(database, "a") == 1
    async with database.transaction() as conn:
        assert await store.renew_lease(conn, "a", 1, TTL)
        assert await store.fence_lease(conn, "a", 1)
    await expire_lease(database)
    assert await acquire(database, "b") == 2
    async with database.transaction() as conn:
        assert not await store.renew_lease(conn, "a", 1, TTL)
        assert not await store.fence_lease(conn, "a", 1)
        assert await store.fence_lease(conn, "b", 2)


async def test_release_lets_a_successor_take_over_at_once(database: Database) -> None:
    assert await acquire(database, "a") == 1
    async with database.transaction() as conn:
        await store.release_lease(conn, "a", 1)
    assert await acquire(database, "b") == 2


async def test_a_successor_in_the_very_millisecond_of_the_release_takes_over(
    database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Timestamps are kept to the millisecond, so a release and the next acquisition can share one. Here
    # they do: SQLite's clock (this process's) is held still, and PostgreSQL's `now()` is the
    # transaction's, the same for both statements below.
    instant = store.utc_now()
    monkeypatch.setattr(store, "utc_now", lambda: instant)
    assert await acquire(database, "a") == 1
    async with database.transaction() as conn:
        await store.release_lease(conn, "a", 1)
        assert await store.acquire_lease(conn, "b", TTL) == 2


def leadership(db: Database, holder: str) -> Leadership:
    return Leadership(db, holder=holder, ttl_ms=4000, renew_ms=100)


async def test_a_leader_task_runs_while_leading_and_stops_when_the_lease_is_lost(database: Database) -> None:
    runs: list[int] = []

    async def record(context: LeaderContext) -> None:
        runs.append(context.epoch)

    node = leadership(database, "a")
    node.register(LeaderTask("record", 20, record))
    await node.start()
    try:
        assert node.is_leader
        await async_wait_until(lambda: now_true(len(runs) >= 2), what="the task to run")
        await expire_lease(database)
        assert await acquire(database, "b") == 2
        await async_wait_until(lambda: now_true(not node.is_leader), timeout=10, what="step-down")
        count = len(runs)
        await asyncio.sleep(0.2)  # several task intervals: nothing may run any more
        assert len(runs) == count and set(runs) == {1}
    finally:
        await node.stop()


async def test_a_fenced_write_with_a_stale_epoch_aborts_and_steps_down(database: Database) -> None:
    node = leadership(database, "a")
    await node.start()
    try:
        context = node.context()
        assert context is not None
        await expire_lease(database)
        assert await acquire(database, "b") == 2
        with pytest.raises(LeaseLost):
            async with context.fenced_transaction() as conn:
                await store.insert_test_leader_write(conn, "test.stale", "must not commit")
        async with database.read() as conn:
            assert (
                await conn.execute(select(cluster_meta).where(cluster_meta.c.key == "test.stale"))
            ).first() is None
        await async_wait_until(lambda: now_true(not node.is_leader), timeout=10, what="step-down")
    finally:
        await node.stop()


async def test_a_task_registered_while_leading_starts_at_once(database: Database) -> None:
    started = asyncio.Event()

    async def mark(_: LeaderContext) -> None:
        started.set()

    node = leadership(database, "a")
    await node.start()
    try:
        node.register(LeaderTask("late", 1000, mark))
        await asyncio.wait_for(started.wait(), 2)
        with pytest.raises(ValueError, match="already registered"):
            node.register(LeaderTask("late", 1000, mark))
    finally:
        await node.stop()


async def test_stopping_releases_the_lease_for_an_immediate_successor(database: Database) -> None:
    first = leadership(database, "a")
    await first.start()
    await first.stop()
    assert not first.is_leader
    second = leadership(database, "b")
    await second.start()
    try:
        assert second.is_leader and second.epoch == 2
    finally:
        await second.stop()


async def test_a_non_holder_takes_over_once_the_holder_stops_renewing(database: Database) -> None:
    holder = leadership(database, "a")
    await holder.start()
    waiting = leadership(database, "b")
    await waiting.start()
    try:
        assert holder.is_leader and not waiting.is_leader
        assert holder._loop_task is not None
        holder._loop_task.cancel()  # the holder stops renewing, like a crashed process
        await async_wait_until(lambda: now_true(waiting.is_leader), timeout=15, what="takeover")
        assert waiting.epoch == 2
    finally:
        await waiting.stop()
        await holder.stop()
