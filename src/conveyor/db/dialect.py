"""Dialect-specific statements behind small functions, each tested on both databases."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Table, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.db.engine import PENDING_NOTIFICATIONS


def dialect_insert(conn: AsyncConnection, table: Table) -> Any:
    """An INSERT that supports `on_conflict_do_update/nothing` on the connection's dialect."""
    return (postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert)(table)


async def next_counter(conn: AsyncConnection, table: Table, keys: dict[str, Any], column: str) -> int:
    """Atomically increment `column` of the row at `keys` (created at 1) and return the new value.

    The upsert's row lock serialises concurrent callers on PostgreSQL; SQLite has one writer.
    """
    statement = dialect_insert(conn, table).values(**keys, **{column: 1})
    statement = statement.on_conflict_do_update(
        index_elements=list(keys), set_={column: table.c[column] + 1}
    ).returning(table.c[column])
    return int((await conn.execute(statement)).scalar_one())


async def notify(conn: AsyncConnection, channel: str, payload: str = "") -> None:
    """PostgreSQL NOTIFY, delivered when the transaction commits (a wake-up hint only).

    Inside a `Database.transaction` the notification is also recorded for that database's in-process
    handlers (`Database.on_commit_notify`), which run after the commit on SQLite and PostgreSQL alike.
    """
    pending = PENDING_NOTIFICATIONS.get(conn)
    if pending is not None:
        pending.append((channel, payload))
    if conn.dialect.name == "postgresql":
        await conn.execute(
            text("SELECT pg_notify(:channel, :payload)"), {"channel": channel, "payload": payload}
        )
