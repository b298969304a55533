"""SQLite write transactions of one process take turns on an asyncio lock (issue 19's fast path); a
transaction that waited the whole busy timeout for its turn meets SQLite's own busy handling, as before."""

import asyncio
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from conveyor.db import engine as engine_module
from conveyor.db.engine import Database


async def test_writers_of_one_loop_all_commit_in_turn(tmp_path: Path) -> None:
    db = Database.connect(f"sqlite:///{tmp_path / 'turns.db'}")
    try:
        async with db.transaction() as conn:
            await conn.execute(text("CREATE TABLE t (n INTEGER)"))

        async def write(n: int) -> None:
            async with db.transaction() as conn:
                await conn.execute(text("INSERT INTO t VALUES (:n)"), {"n": n})
                await asyncio.sleep(0)  # let the others queue behind this one

        await asyncio.wait_for(asyncio.gather(*(write(n) for n in range(50))), 60)
        async with db.read() as conn:
            rows = sorted(n for (n,) in (await conn.execute(text("SELECT n FROM t"))).all())
        assert rows == list(range(50))
    finally:
        await db.dispose()


async def test_a_writer_that_waited_the_busy_timeout_gets_sqlite_s_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine_module, "SQLITE_BUSY_TIMEOUT_MS", 300)
    db = Database.connect(f"sqlite:///{tmp_path / 'nested.db'}")
    try:
        async with db.transaction() as conn:
            await conn.execute(text("CREATE TABLE t (n INTEGER)"))
        async with db.transaction() as outer:
            await outer.execute(text("INSERT INTO t VALUES (1)"))
            # A transaction nested in another cannot get the write lock while the outer one holds it.
            with pytest.raises(OperationalError, match="database is locked"):
                async with db.transaction() as inner:
                    await inner.execute(text("INSERT INTO t VALUES (2)"))
        async with db.transaction() as conn:  # the turn was given back: later writers proceed
            await conn.execute(text("INSERT INTO t VALUES (3)"))
        async with db.read() as conn:
            assert sorted(n for (n,) in (await conn.execute(text("SELECT n FROM t"))).all()) == [1, 3]
    finally:
        await db.dispose()
