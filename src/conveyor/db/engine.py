"""Engine factory for both dialects and the two ways code talks to the database: read or write.

SQLite runs in WAL mode with a busy timeout, and every write transaction starts with `BEGIN
IMMEDIATE`: a deferred transaction that reads and then writes can fail with SQLITE_BUSY without
waiting, whereas an immediate one queues on the busy timeout. Reads run in autocommit mode so they
never take the write lock.

Within one process, SQLite write transactions also take turns on an asyncio lock (one per event loop):
the busy timeout's handler polls with sleeps of 1, 2, 5, 10 … ms, so a writer that found the lock held
paid several milliseconds after it was free (a dispatcher's claim queued behind a delivery's finish, on
every webhook); the asyncio lock hands over at once, in arrival order. Other processes still meet the
busy timeout.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.engine.url import URL
from sqlalchemy.exc import DBAPIError, DisconnectionError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from conveyor.db.sqlite_driver import OneTripAiosqliteDBAPI
from conveyor.errors import ConveyorError

Dialect = Literal["sqlite", "postgresql"]

SQLITE_BUSY_TIMEOUT_MS = 30_000
# The execution option of `Database.read()` on SQLite: no `BEGIN`, so every statement commits on its own.
# Not `isolation_level="AUTOCOMMIT"`, whose switch on and off costs three trips to the driver's thread
# per read, for nothing: the sqlite3 connection is always in autocommit mode, and only this hook begins.
SQLITE_READ_OPTION = "conveyor_sqlite_read"
# A pooled PostgreSQL connection is pinged before use only when it sat idle in the pool this long. A ping
# on every checkout (SQLAlchemy's `pool_pre_ping`) is a round trip per transaction, about a tenth of a
# claim's CPU; a connection handed back within the last second is as likely alive as one in mid-use,
# which no ping protects either. One that died meanwhile (a server restart) fails its transaction, and
# SQLAlchemy then discards every pooled connection older than it.
PING_AFTER_IDLE_S = 1.0
# Deadlock, serialisation failure, lock not available (PostgreSQL); SQLite's busy writer lock.
TRANSIENT_SQLSTATES = frozenset({"40P01", "40001", "55P03"})


def is_transient(exc: DBAPIError | PoolTimeout) -> bool:
    """Whether the database aborted the transaction (or no connection was free, or the connection was lost)
    and a retry may succeed."""
    if isinstance(exc, PoolTimeout):
        return True
    if exc.connection_invalidated:
        # The session was ended under the transaction (pg_terminate_backend, a failover, a dropped socket);
        # the pool has discarded it, so a retry runs on a new one. Callers retry only guarded, idempotent
        # writes, so a commit that did land before the connection was lost is not applied twice.
        return True
    if getattr(exc.orig, "sqlstate", None) in TRANSIENT_SQLSTATES:
        return True
    return "database is locked" in str(exc.orig)


T = TypeVar("T")


async def retry_transient(
    call: Callable[[], Awaitable[T]], *, attempts: int, what: str, log: logging.Logger
) -> T:
    """`call()`, tried again while it fails with an error after which a retry may succeed (`is_transient`),
    at most `attempts` times in all, 50 ms apart and twice as long each time; any other error, or the last,
    is raised. Only for guarded, idempotent writes: a commit that landed before its connection was lost
    must not apply twice. `what` names the work in the warning each retry logs (through `log`)."""
    for attempt in range(attempts):
        try:
            return await call()
        except (DBAPIError, PoolTimeout) as exc:
            if attempt == attempts - 1 or not is_transient(exc):
                raise
            log.warning("retrying %s after a transient database error: %s", what, getattr(exc, "orig", exc))
            await asyncio.sleep(0.05 * 2**attempt)
    raise AssertionError("unreachable")


class DatabaseUrlError(ConveyorError, ValueError):
    """The database URL names a database Conveyor cannot use."""


def dialect_of(url: str | URL) -> Dialect:
    """Return which of the two supported databases a URL names."""
    backend = make_url(url).get_backend_name()
    if backend == "sqlite":
        return "sqlite"
    if backend in ("postgresql", "postgres"):
        return "postgresql"
    raise DatabaseUrlError(f"unsupported database {backend!r}: use a postgresql:// or sqlite:// URL")


def _with_driver(url: str | URL, *, asynchronous: bool) -> URL:
    parsed = make_url(str(url).replace("postgres://", "postgresql://", 1))
    if dialect_of(parsed) == "sqlite":
        return parsed.set(drivername="sqlite+aiosqlite" if asynchronous else "sqlite+pysqlite")
    return parsed.set(drivername="postgresql+psycopg")


class RollbackOnCloseConnection(sqlite3.Connection):
    """A sqlite3 connection that ends its transaction before closing.

    `close()` on a connection whose cursor still holds an unfinished statement (a task cancelled
    mid-query, its traceback keeping the cursor alive) does not close it: SQLite keeps it as a zombie,
    open transaction and write lock included, until that cursor is garbage-collected. Every other
    writer then waits out its busy timeout. Rolling back first releases the lock at once.
    """

    def close(self) -> None:
        try:
            if self.in_transaction:
                self.rollback()
        finally:
            super().close()


def _install_sqlite_hooks(sync_engine: Engine) -> None:
    @event.listens_for(sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Take transaction control away from the driver: we emit BEGIN ourselves.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @event.listens_for(sync_engine, "begin")
    def _on_begin(connection: Any) -> None:
        options = connection.get_execution_options()
        if options.get(SQLITE_READ_OPTION) or options.get("isolation_level") == "AUTOCOMMIT":
            return
        connection.exec_driver_sql("BEGIN IMMEDIATE")


def _install_postgresql_pool_hooks(sync_engine: Engine, ping_after_idle_s: float) -> None:
    @event.listens_for(sync_engine, "checkin")
    def _on_checkin(_dbapi_connection: Any, record: Any) -> None:
        record.info["idle_since"] = time.monotonic()

    @event.listens_for(sync_engine, "checkout")
    def _on_checkout(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        idle_since = record.info.get("idle_since")
        if idle_since is None or time.monotonic() - idle_since < ping_after_idle_s:
            return  # just connected, or handed back a moment ago
        try:
            sync_engine.dialect.do_ping(dbapi_connection)
        except Exception as exc:
            # The pool discards this connection and checks out another (a new one if need be).
            raise DisconnectionError(f"pooled connection failed its ping: {exc}") from exc


def create_sync_engine(url: str | URL) -> Engine:
    """A synchronous engine for migrations and offline CLI commands."""
    engine = create_engine(_with_driver(url, asynchronous=False), poolclass=NullPool)
    if dialect_of(url) == "sqlite":
        _install_sqlite_hooks(engine)
    return engine


# The notifications `notify` recorded in each open `Database.transaction`, by connection. Not `conn.info`:
# that belongs to the pooled DBAPI connection, and reading it raises once a transaction has failed.
PENDING_NOTIFICATIONS: weakref.WeakKeyDictionary[AsyncConnection, list[tuple[str, str]]] = (
    weakref.WeakKeyDictionary()
)


# SQLite's SQLITE_FULL, PostgreSQL's disk_full class (53100) and the OS's ENOSPC as either reports it.
_DISK_FULL_TEXTS = ("database or disk is full", "no space left on device", "could not extend file")


def is_disk_full(error: BaseException | None) -> bool:
    """Whether a driver error says the disk is full."""
    if error is None:
        return False
    if getattr(error, "sqlite_errorcode", None) == 13 or getattr(error, "sqlstate", None) == "53100":
        return True
    return any(text in str(error).lower() for text in _DISK_FULL_TEXTS)


@dataclass
class Database:
    """The process's database: an async engine plus its dialect.

    `local_handlers[channel]` are called in this process, after a `transaction()` that sent `notify(channel,
    payload)` has committed, on either database: what PostgreSQL's NOTIFY does across processes, for a
    consumer that must see this process's own writes at once (SQLite has no NOTIFY at all).
    """

    engine: AsyncEngine
    dialect: Dialect
    url: str
    local_handlers: dict[str, list[Callable[[str], None]]] = field(default_factory=dict)
    # When (monotonic) a statement last failed because the disk (the database's, or PostgreSQL's) is full.
    disk_full_at: float | None = None
    _write_turns: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = field(
        default_factory=weakref.WeakKeyDictionary, repr=False
    )

    def on_commit_notify(self, channel: str, handler: Callable[[str], None]) -> None:
        """Call `handler(payload)` after each committed transaction of this process that notified `channel`."""
        self.local_handlers.setdefault(channel, []).append(handler)

    @classmethod
    def connect(
        cls,
        url: str,
        *,
        pool_size: int = 10,
        connect_timeout_s: float = 5.0,
        ping_after_idle_s: float = PING_AFTER_IDLE_S,
    ) -> Database:
        """Create the engine (no connection is opened until first use)."""
        dialect = dialect_of(url)
        kwargs: dict[str, Any] = {}
        if dialect == "postgresql":
            kwargs.update(
                pool_size=pool_size,
                max_overflow=pool_size,
                pool_timeout=connect_timeout_s,
                connect_args={"connect_timeout": max(1, int(connect_timeout_s))},
            )
        else:
            kwargs.update(
                connect_args={
                    "timeout": SQLITE_BUSY_TIMEOUT_MS / 1000,
                    "factory": RollbackOnCloseConnection,
                },
                module=OneTripAiosqliteDBAPI.load(),
            )
        engine = create_async_engine(_with_driver(url, asynchronous=True), **kwargs)
        if dialect == "sqlite":
            _install_sqlite_hooks(engine.sync_engine)
        else:
            _install_postgresql_pool_hooks(engine.sync_engine, ping_after_idle_s)
        database = cls(engine=engine, dialect=dialect, url=url)

        @event.listens_for(engine.sync_engine, "handle_error")
        def _on_error(context: Any) -> None:
            if is_disk_full(context.original_exception):
                database.disk_full_at = time.monotonic()

        return database

    def disk_full_within(self, seconds: float) -> bool:
        """Whether a statement failed for a full disk in the last `seconds` (`/ready` reports it)."""
        return self.disk_full_at is not None and time.monotonic() - self.disk_full_at <= seconds

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncConnection]:
        """A write transaction: committed when the block ends, rolled back if it raises."""
        if self.dialect != "sqlite":
            async with self._transaction() as conn:
                yield conn
            return
        turn = await self._sqlite_write_turn()
        try:
            async with self._transaction() as conn:
                yield conn
        finally:
            if turn is not None:
                turn.release()

    async def _sqlite_write_turn(self) -> asyncio.Lock | None:
        """This loop's SQLite write lock, acquired; None when a writer held it for the whole busy timeout
        (a transaction nested in another would): then SQLite's busy handler decides, as without it."""
        loop = asyncio.get_running_loop()
        turn = self._write_turns.get(loop)
        if turn is None:
            turn = self._write_turns[loop] = asyncio.Lock()
        try:
            async with asyncio.timeout(SQLITE_BUSY_TIMEOUT_MS / 1000):
                await turn.acquire()
        except TimeoutError:
            return None
        return turn

    @asynccontextmanager
    async def _transaction(self) -> AsyncIterator[AsyncConnection]:
        pending: list[tuple[str, str]] = []
        async with self.engine.begin() as conn:
            PENDING_NOTIFICATIONS[conn] = pending
            try:
                yield conn
            finally:
                PENDING_NOTIFICATIONS.pop(conn, None)
        for channel, payload in pending:  # reached only after the commit succeeded
            for handler in self.local_handlers.get(channel, ()):
                handler(payload)

    @asynccontextmanager
    async def read(self) -> AsyncIterator[AsyncConnection]:
        """An autocommit connection for reads that must not take SQLite's write lock."""
        async with self.engine.connect() as conn:
            if self.dialect == "sqlite":
                yield await conn.execution_options(**{SQLITE_READ_OPTION: True})
            else:
                yield await conn.execution_options(isolation_level="AUTOCOMMIT")

    async def dispose(self) -> None:
        """Close every pooled connection."""
        await self.engine.dispose()


async def check_reachable(db: Database, timeout_s: float) -> None:
    """`SELECT 1` within the timeout; raises on failure (`/ready` and `/cluster/health` ask it)."""
    async with asyncio.timeout(timeout_s):
        async with db.read() as conn:
            await conn.execute(text("SELECT 1"))
