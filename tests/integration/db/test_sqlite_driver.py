"""The SQLite driver adaptation (`db/sqlite_driver.py`): one trip to aiosqlite's thread per statement,
none for a read's set-up or a rollback of nothing — and the same answers SQLAlchemy's cursor gave."""

from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiosqlite
import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, insert, select, text, update
from sqlalchemy.exc import IntegrityError

from conveyor.db.engine import Database

metadata = MetaData()
items = Table(
    "items",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("name", String, unique=True, nullable=False),
)


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[Database]:
    database = Database.connect(f"sqlite:///{tmp_path / 'driver.db'}")
    async with database.transaction() as conn:
        await conn.run_sync(metadata.create_all)
    try:
        yield database
    finally:
        await database.dispose()


@pytest.fixture
def trips(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Every call queued to an aiosqlite connection's thread, by the function's name."""
    counted: Counter[str] = Counter()
    original = aiosqlite.Connection._execute

    async def counting(self: aiosqlite.Connection, fn: Any, *args: Any, **kwargs: Any) -> Any:
        counted[getattr(fn, "__name__", repr(fn))] += 1
        return await original(self, fn, *args, **kwargs)

    monkeypatch.setattr(aiosqlite.Connection, "_execute", counting)
    return counted


async def test_a_read_is_one_trip_to_the_driver_thread(db: Database, trips: Counter[str]) -> None:
    async with db.read() as conn:  # the pool's connection is open: only the statement remains
        await conn.execute(select(items.c.id))
    trips.clear()
    async with db.read() as conn:
        assert (await conn.execute(text("SELECT 41 + 1"))).scalar_one() == 42
    assert sum(trips.values()) == 1, trips


async def test_a_one_statement_write_is_begin_statement_commit(db: Database, trips: Counter[str]) -> None:
    async with db.transaction() as conn:
        await conn.execute(insert(items).values(name="warm"))
    trips.clear()
    async with db.transaction() as conn:
        await conn.execute(insert(items).values(name="a"))
    assert sum(trips.values()) == 3, trips  # BEGIN IMMEDIATE, the INSERT, COMMIT; no rollback after


async def test_rowcount_lastrowid_rows_and_executemany(db: Database) -> None:
    async with db.transaction() as conn:
        first = await conn.execute(insert(items).values(name="a"))
        assert first.inserted_primary_key is not None and first.inserted_primary_key[0] >= 1
        await conn.execute(insert(items), [{"name": "b"}, {"name": "c"}, {"name": "d"}])
        changed = await conn.execute(
            update(items).where(items.c.name.in_(["b", "c"])).values(name=items.c.name + "!")
        )
        assert changed.rowcount == 2
        returned = await conn.execute(insert(items).values(name="e").returning(items.c.id, items.c.name))
        assert returned.one().name == "e"
    async with db.read() as conn:
        result = await conn.execute(select(items.c.name).order_by(items.c.id))
        assert list(result.keys()) == ["name"]
        assert result.scalars().all() == ["a", "b!", "c!", "d", "e"]
        empty = await conn.execute(select(items.c.name).where(items.c.name == "none"))
        assert empty.first() is None


async def test_an_error_rolls_the_transaction_back_and_keeps_the_connection_usable(db: Database) -> None:
    with pytest.raises(IntegrityError):
        async with db.transaction() as conn:
            await conn.execute(insert(items).values(name="kept-out"))
            await conn.execute(insert(items).values(name="kept-out"))  # unique: fails
    async with db.transaction() as conn:
        await conn.execute(insert(items).values(name="after"))
    async with db.read() as conn:
        assert (await conn.execute(select(items.c.name))).scalars().all() == ["after"]


async def test_a_read_does_not_wait_for_a_writer_and_sees_only_committed_rows(db: Database) -> None:
    async with db.transaction() as writer:
        await writer.execute(insert(items).values(name="uncommitted"))
        async with db.read() as reader:  # would wait on the write lock if the read began a transaction
            assert (await reader.execute(select(items.c.name))).scalars().all() == []
    async with db.read() as reader:
        assert (await reader.execute(select(items.c.name))).scalars().all() == ["uncommitted"]
