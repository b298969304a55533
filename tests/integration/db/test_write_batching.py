"""Group commit for small writes (`db/write_batching.py`) on both databases: concurrent units share a
transaction, each caller gets its own unit's result once committed, and a unit that fails fails only
its own caller."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.db.engine import Database
from conveyor.db.write_batching import WriteBatcher


async def make_table(db: Database) -> None:
    async with db.transaction() as conn:
        await conn.execute(text("CREATE TABLE batched (n INTEGER PRIMARY KEY)"))


async def stored(db: Database) -> list[int]:
    async with db.read() as conn:
        return sorted(n for (n,) in (await conn.execute(text("SELECT n FROM batched"))).all())


def insert_unit(n: int):  # type: ignore[no-untyped-def]
    async def unit(conn: AsyncConnection) -> int:
        await conn.execute(text("INSERT INTO batched (n) VALUES (:n)"), {"n": n})
        return n * 10

    return unit


async def test_concurrent_units_share_commits_and_each_gets_its_result(database: Database) -> None:
    await make_table(database)
    batcher = WriteBatcher(database)
    results = await asyncio.wait_for(asyncio.gather(*(batcher.run(insert_unit(n)) for n in range(40))), 60)
    assert results == [n * 10 for n in range(40)]
    assert await stored(database) == list(range(40))
    assert len(batcher.batch_sizes) < 40 and sum(batcher.batch_sizes) == 40
    # Nothing waits for company: a unit alone commits at once, alone.
    assert await batcher.run(insert_unit(40)) == 400
    assert batcher.batch_sizes[-1] == 1


async def test_a_failing_unit_fails_only_its_caller(database: Database) -> None:
    await make_table(database)
    batcher = WriteBatcher(database)

    async def failing(conn: AsyncConnection) -> int:
        await conn.execute(text("INSERT INTO batched (n) VALUES (1000)"))
        raise ValueError("this unit refuses")

    async def duplicate(conn: AsyncConnection) -> int:
        await conn.execute(text("INSERT INTO batched (n) VALUES (0)"))  # 0 is stored by a neighbour
        return -1

    units = [insert_unit(0), failing, insert_unit(1), duplicate, insert_unit(2)]
    answers = await asyncio.wait_for(
        asyncio.gather(*(batcher.run(u) for u in units), return_exceptions=True), 60
    )
    assert answers[0] == 0 and answers[2] == 10 and answers[4] == 20
    assert isinstance(answers[1], ValueError)
    assert isinstance(answers[3], Exception)  # the unique key: an IntegrityError from the database
    assert await stored(database) == [0, 1, 2]  # nothing of the failed units, all of the others
    assert list(batcher.batch_sizes) == [5, 1, 1, 1, 1, 1]  # tried together, then each on its own


async def test_a_caller_that_goes_away_does_not_undo_the_shared_commit(database: Database) -> None:
    await make_table(database)
    batcher = WriteBatcher(database)
    started, release = asyncio.Event(), asyncio.Event()

    async def slow(conn: AsyncConnection) -> int:
        await conn.execute(text("INSERT INTO batched (n) VALUES (7)"))
        started.set()
        await release.wait()  # its caller is cancelled while its transaction is open
        return 7

    leaving = asyncio.ensure_future(batcher.run(slow))
    await asyncio.wait_for(started.wait(), 30)
    staying = asyncio.ensure_future(batcher.run(insert_unit(8)))
    leaving.cancel()  # cancels the caller's wait at once; the shielded unit goes on
    release.set()
    assert await asyncio.wait_for(staying, 30) == 80
    with pytest.raises(asyncio.CancelledError):
        await leaving
    assert await stored(database) == [7, 8]
