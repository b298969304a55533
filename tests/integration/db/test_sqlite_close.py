"""A SQLite connection closed while a cursor is still open must not keep the write lock."""

import asyncio
from pathlib import Path
from typing import Any

from sqlalchemy import text

from conveyor.db.engine import Database

# Long enough that the cancel surely lands while the statement runs on the driver's thread.
SLOW_QUERY = (
    "WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c WHERE n < 500000) SELECT count(*) FROM c"
)


async def test_a_task_cancelled_mid_query_with_an_open_cursor_frees_the_write_lock(tmp_path: Path) -> None:
    db = Database.connect(f"sqlite:///{tmp_path / 'close.db'}")
    try:
        async with db.transaction() as conn:
            await conn.execute(text("CREATE TABLE t (x INTEGER)"))
            await conn.execute(text("INSERT INTO t VALUES (1), (2), (3)"))
        kept: list[Any] = []
        querying = asyncio.Event()

        async def writer_cancelled_mid_query() -> None:
            async with db.transaction() as conn:
                await conn.execute(text("INSERT INTO t VALUES (99)"))
                # A statement left unfinished, as a cancelled task's traceback can keep one alive.
                kept.append(await conn.stream(text("SELECT x FROM t")))
                querying.set()
                await conn.execute(text(SLOW_QUERY))

        task = asyncio.create_task(writer_cancelled_mid_query())
        await querying.wait()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert task.cancelled()

        # The busy timeout is 30 s: a zombie connection holding the lock would blow this deadline.
        async with asyncio.timeout(10):
            async with db.transaction() as conn:
                await conn.execute(text("INSERT INTO t VALUES (4)"))
        async with db.read() as conn:
            values = sorted((await conn.execute(text("SELECT x FROM t"))).scalars())
        assert values == [1, 2, 3, 4]  # the cancelled writer's row was rolled back
        kept.clear()
    finally:
        await db.dispose()
