"""Hand-written PostgreSQL statements run on psycopg itself, inside the caller's SQLAlchemy transaction.

For the few statements every dispatched job runs (the queue's claim and a job's end, issue 20), named in
the package that runs them (`execution/sql.py`) beside their SQLAlchemy Core twins. A Core
statement costs far more Python time than the database takes to run it: its construction and cache key,
the execution context, the async bridge's greenlet switches, the result's metadata. On the hot path that
time was most of a claim + complete. Here the statement is a constant string and psycopg prepares it
after a few executions, as it does SQLAlchemy's.

The driver connection is the one the SQLAlchemy connection holds, so the statement is part of its
transaction: committed or rolled back with it. Errors are raised as SQLAlchemy's `DBAPIError` subclasses,
so callers catching a deadlock or a serialisation failure see what they see from SQLAlchemy.

Parameters follow psycopg: `%(name)s`; JSON goes in wrapped in `Jsonb`; datetimes must be aware and
truncated to milliseconds (`utc_now()` is), as `UTCDateTime` stores them. Timestamps read here come back in
the session's time zone, not UTC: the hot path reads none.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import psycopg
from psycopg.types.json import Jsonb
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection

__all__ = ["Jsonb", "fetch_all", "fetch_one"]


def _driver(conn: AsyncConnection) -> psycopg.AsyncConnection[Any]:
    """The psycopg connection under a started SQLAlchemy connection (no I/O)."""
    started = conn.sync_connection
    assert started is not None, "the connection is not started"
    driver = started.connection.driver_connection
    assert isinstance(driver, psycopg.AsyncConnection), "driver_sql is for PostgreSQL (psycopg) only"
    return driver


async def _execute(conn: AsyncConnection, sql: str, params: Mapping[str, Any]) -> psycopg.AsyncCursor[Any]:
    try:
        return await _driver(conn).execute(sql, params)
    except psycopg.Error as exc:
        raise DBAPIError.instance(sql, dict(params), exc, psycopg.Error) from exc


async def fetch_all(conn: AsyncConnection, sql: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
    """Run `sql` in the connection's transaction; every row (an empty list for a statement without any)."""
    cursor = await _execute(conn, sql, params)
    if cursor.description is None:
        return []
    try:
        return await cursor.fetchall()
    except psycopg.Error as exc:
        raise DBAPIError.instance(sql, dict(params), exc, psycopg.Error) from exc


async def fetch_one(conn: AsyncConnection, sql: str, params: Mapping[str, Any]) -> tuple[Any, ...] | None:
    """Run `sql` in the connection's transaction; its first row, or None."""
    rows = await fetch_all(conn, sql, params)
    return rows[0] if rows else None
