"""Creating and dropping the PostgreSQL databases a test run owns (never any other)."""

from __future__ import annotations

import os
import uuid

import psycopg
from psycopg import sql
from sqlalchemy import text
from sqlalchemy.engine import make_url

from conveyor.db.engine import Database

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
TEST_DB_PREFIX = "conveyor_test_"


def server_url() -> str:
    """The maintenance URL of the test PostgreSQL server."""
    return os.environ.get("CONVEYOR_TEST_DATABASE_URL", DEFAULT_URL)


def url_for(database: str) -> str:
    """A URL on the test server naming `database`."""
    return make_url(server_url()).set(database=database).render_as_string(hide_password=False)


def _connect() -> psycopg.Connection:
    url = make_url(server_url())
    return psycopg.connect(
        host=url.host or "127.0.0.1",
        port=url.port or 5432,
        user=url.username or "postgres",
        password=url.password,
        dbname=url.database or "postgres",
        autocommit=True,
        connect_timeout=5,
    )


def new_database_name(kind: str = "") -> str:
    """A fresh name under the test prefix."""
    return f"{TEST_DB_PREFIX}{kind}{uuid.uuid4().hex[:12]}"


def create_database(name: str, template: str | None = None) -> str:
    """CREATE DATABASE (optionally from a template); return its URL."""
    assert name.startswith(TEST_DB_PREFIX)
    with _connect() as conn:
        statement = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
        if template:
            statement = sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(template)
            )
        conn.execute(statement)
    return url_for(name)


def drop_database(name: str) -> None:
    """DROP DATABASE … WITH (FORCE), only for names this run created."""
    assert name.startswith(TEST_DB_PREFIX)
    with _connect() as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def check_reachable() -> None:
    """Fail loudly (never skip) when the test PostgreSQL does not answer."""
    try:
        with _connect() as conn:
            conn.execute("SELECT 1")
    except Exception as exc:
        raise RuntimeError(
            f"PostgreSQL at {server_url()} does not answer ({exc}); run the tests with `make test`, "
            "which starts one, or set CONVEYOR_TEST_DATABASE_URL"
        ) from exc


async def someone_waits_on_a_lock(db: Database) -> bool:
    """Whether any session of `db`'s database is waiting on a lock right now."""
    async with db.read() as conn:
        waiting = await conn.execute(
            text(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
        )
        return int(waiting.scalar_one()) > 0
