"""SQLAlchemy's aiosqlite adaptation with one trip to the driver's thread per statement.

aiosqlite runs each SQLite connection on a thread of its own and hands it every call through a queue;
each call is a round trip (queue, thread wake-up, the event loop woken back through its self-pipe),
about 0.1 ms of CPU. SQLAlchemy's adaptation makes four of them per statement that returns rows
(open a cursor, execute, fetch, close the cursor) and three for one that does not; the event loop of a
busy orchestrator spent a large share of its time in them. Here the statement is executed, its rows
fetched and its cursor closed in *one* function on the driver's thread, which is what SQLAlchemy does
in effect anyway: it buffers a non-server-side cursor's rows in full before returning.

Two more trips are skipped, never needed with Conveyor's transaction control (`engine.py`: the sqlite3
connection is in autocommit mode and Conveyor emits `BEGIN IMMEDIATE` itself): a rollback or commit when
no transaction is open (the pool's reset of every connection it takes back, and the end of a read).

Used through `create_async_engine(..., module=OneTripAiosqliteDBAPI.load())`; the dialect is SQLAlchemy's
own `sqlite+aiosqlite`, and server-side cursors keep SQLAlchemy's behaviour.
"""

from __future__ import annotations

import collections
import sqlite3
from collections.abc import Sequence
from typing import Any

from sqlalchemy.dialects.sqlite.aiosqlite import (
    AsyncAdapt_aiosqlite_connection,
    AsyncAdapt_aiosqlite_cursor,
    AsyncAdapt_aiosqlite_dbapi,
)
from sqlalchemy.util import EMPTY_DICT
from sqlalchemy.util.concurrency import await_only

_NO_PARAMETERS: tuple[()] = ()


def _run_statement(
    conn: sqlite3.Connection, operation: str, parameters: Any, many: bool
) -> tuple[Any, list[Any], int, int | None]:
    """On the driver's thread: execute, fetch every row, close; what the cursor would have told."""
    cursor = conn.cursor()
    try:
        if many:
            cursor.executemany(operation, parameters)
        else:
            cursor.execute(operation, _NO_PARAMETERS if parameters is None else parameters)
        description = cursor.description
        rows = cursor.fetchall() if description else []
        return description, rows, cursor.rowcount, cursor.lastrowid
    finally:
        cursor.close()


class OneTripCursor(AsyncAdapt_aiosqlite_cursor):
    """A buffered cursor whose `execute` is a single call on the connection's thread."""

    __slots__ = ("_description", "_lastrowid", "_rowcount")

    def __init__(self, adapt_connection: Any) -> None:
        # No driver cursor is opened here: each statement opens and closes its own on the thread.
        self._adapt_connection = adapt_connection
        self._connection = adapt_connection._connection
        self._cursor = None  # type: ignore[assignment]
        self._soft_closed_memoized = EMPTY_DICT
        self._rows = collections.deque()
        self._description: Any = None
        self._rowcount = -1
        self._lastrowid: int | None = None

    @property
    def description(self) -> Any:
        return self._description

    @property
    def rowcount(self) -> int:
        return self._rowcount

    @property
    def lastrowid(self) -> Any:
        return self._lastrowid

    @property
    def arraysize(self) -> int:
        return 1

    @arraysize.setter
    def arraysize(self, value: int) -> None:
        pass

    async def _async_soft_close(self) -> None:
        """Nothing to close: the driver's cursor closed with its statement."""

    def close(self) -> None:
        self._rows.clear()

    async def _run(self, operation: Any, parameters: Any, many: bool) -> None:
        async with self._adapt_connection._execute_mutex:
            description, rows, rowcount, lastrowid = await self._connection._execute(
                _run_statement, self._connection._conn, operation, parameters, many
            )
        self._description = description
        self._rows = collections.deque(rows)
        self._rowcount = rowcount
        self._lastrowid = lastrowid

    async def _execute_async(self, operation: Any, parameters: Any) -> None:
        await self._run(operation, parameters, False)

    async def _executemany_async(self, operation: Any, seq_of_parameters: Sequence[Any]) -> None:
        await self._run(operation, seq_of_parameters, True)


class OneTripConnection(AsyncAdapt_aiosqlite_connection):
    """aiosqlite's adapted connection with `OneTripCursor` and no trip for a rollback or commit of nothing."""

    __slots__ = ()
    _cursor_cls = OneTripCursor

    def _in_transaction(self) -> bool:
        # Read on the event loop's thread: a C call on a connection no statement is using (SQLAlchemy
        # ends a transaction only between statements), opened with check_same_thread=False.
        raw = self._connection._connection
        return raw is not None and raw.in_transaction

    def rollback(self) -> None:
        if self._in_transaction():
            super().rollback()

    def commit(self) -> None:
        if self._in_transaction():
            super().commit()


class OneTripAiosqliteDBAPI(AsyncAdapt_aiosqlite_dbapi):
    """The DBAPI module SQLAlchemy's aiosqlite dialect is given, making `OneTripConnection`s."""

    @classmethod
    def load(cls) -> OneTripAiosqliteDBAPI:
        import aiosqlite

        return cls(aiosqlite, sqlite3)

    def connect(self, *arg: Any, **kw: Any) -> OneTripConnection:
        kw["check_same_thread"] = False
        connection = self.aiosqlite.connect(*arg, **kw)
        # aiosqlite before 0.22 is a Thread itself; later it holds one.
        getattr(connection, "_thread", connection).daemon = True
        return OneTripConnection(self, await_only(connection))
