"""The `blobs` table's SQL (docs/design/artifacts.md §2): which stored blobs are live, and the locking
that keeps the sweep from deleting a blob an upload is about to reference."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, delete, func, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.db.dialect import dialect_insert
from conveyor.db.tables import blobs


async def mark_live(conn: AsyncConnection, sha256: str, size: int, now: datetime) -> None:
    """A put of `sha256` ended: the row is live and fresh (waiting on a sweep that holds it doomed)."""
    statement = dialect_insert(conn, blobs).values(
        sha256=sha256, size=size, state="live", created_at=now, touched_at=now
    )
    statement = statement.on_conflict_do_update(
        index_elements=["sha256"], set_={"state": "live", "touched_at": now, "size": size}
    )
    await conn.execute(statement)


async def lock_live(conn: AsyncConnection, sha256: str) -> bool:
    """Lock the row for a commit that will reference it; False when it is gone or doomed."""
    query = select(blobs.c.state).where(blobs.c.sha256 == sha256)
    if conn.dialect.name == "postgresql":
        query = query.with_for_update()
    state = (await conn.execute(query)).scalar_one_or_none()
    return state == "live"


async def doom_unreferenced(
    conn: AsyncConnection,
    references: Sequence[ColumnElement[Any]],
    touched_before: datetime,
    limit: int,
) -> int:
    """Mark `doomed` up to `limit` live rows untouched since `touched_before` that no reference names."""
    candidates = select(blobs.c.sha256).where(blobs.c.state == "live", blobs.c.touched_at < touched_before)
    for column in references:
        candidates = candidates.where(~select(column).where(column == blobs.c.sha256).exists())
    chosen = [row.sha256 for row in await conn.execute(candidates.limit(limit))]
    if not chosen:
        return 0
    result = await conn.execute(
        update(blobs).where(blobs.c.sha256.in_(chosen), blobs.c.state == "live").values(state="doomed")
    )
    return int(result.rowcount or 0)


async def doomed(conn: AsyncConnection, limit: int) -> list[str]:
    """Digests of doomed rows."""
    rows = await conn.execute(select(blobs.c.sha256).where(blobs.c.state == "doomed").limit(limit))
    return [row.sha256 for row in rows]


async def lock_doomed(conn: AsyncConnection, sha256: str) -> bool:
    """Lock a row that is still doomed (a put since then made it live: then False)."""
    query = select(blobs.c.sha256).where(blobs.c.sha256 == sha256, blobs.c.state == "doomed")
    if conn.dialect.name == "postgresql":
        query = query.with_for_update()
    return (await conn.execute(query)).first() is not None


async def claim_orphan(conn: AsyncConnection, sha256: str, size: int, now: datetime) -> bool:
    """A stored object with no row: insert a doomed row for it; False when a row exists (keep it)."""
    statement = (
        dialect_insert(conn, blobs)
        .values(sha256=sha256, size=size, state="doomed", created_at=now, touched_at=now)
        .on_conflict_do_nothing(index_elements=["sha256"])
        .returning(blobs.c.sha256)
    )
    # The returned row, not `rowcount`: PostgreSQL's driver counts a skipped conflicting insert as a row.
    return (await conn.execute(statement)).first() is not None


async def forget(conn: AsyncConnection, sha256: str) -> None:
    """Delete a row (its object is gone)."""
    await conn.execute(delete(blobs).where(blobs.c.sha256 == sha256))


async def known(conn: AsyncConnection, digests: Sequence[str]) -> set[str]:
    """Which of `digests` have a row."""
    if not digests:
        return set()
    rows = await conn.execute(select(blobs.c.sha256).where(blobs.c.sha256.in_(list(digests))))
    return {row.sha256 for row in rows}


async def count(conn: AsyncConnection) -> int:
    """Rows in the table (tests and the sweep's log)."""
    return int((await conn.execute(select(func.count()).select_from(blobs))).scalar_one())
