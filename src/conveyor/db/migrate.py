"""Schema migrations: where a database stands against this build, and upgrading it under a lock.

Racing coordinators must migrate once: on PostgreSQL the upgrade holds a transaction-level advisory
lock; on SQLite an exclusive file lock next to the database file (one node per file anyway).
"""

from __future__ import annotations

import fcntl
import functools
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import text
from sqlalchemy.engine import Connection, make_url

from conveyor.db.engine import create_sync_engine, dialect_of
from conveyor.errors import ConveyorError

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
# An arbitrary constant shared by every Conveyor node: the advisory lock that serialises migrations.
MIGRATION_LOCK_ID = 0x0C0_17E7


class MigrationError(ConveyorError):
    """The schema cannot be brought to (or used at) this build's revision."""


SchemaState = Literal["empty", "behind", "current", "ahead"]


@dataclass(frozen=True)
class SchemaStatus:
    """The database's revision compared with this build's head."""

    current: str | None
    head: str
    state: SchemaState

    def describe(self) -> str:
        """One line for `/ready`, `db status` and boot errors."""
        return f"at {self.current or 'empty'}, head is {self.head}"


def alembic_config() -> Config:
    """An Alembic config pointing at the migrations shipped in the package."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    return config


@functools.cache
def _script() -> ScriptDirectory:
    return ScriptDirectory.from_config(alembic_config())


@functools.cache
def known_revisions() -> frozenset[str]:
    """Every revision this build ships."""
    return frozenset(rev.revision for rev in _script().walk_revisions())


def head_revision() -> str:
    """This build's newest revision."""
    head = _script().get_current_head()
    assert head is not None, "the package ships no migrations"
    return head


def status_on(connection: Connection) -> SchemaStatus:
    """Read the revision a database is at and classify it against this build."""
    current = MigrationContext.configure(connection).get_current_revision()
    head = head_revision()
    if current is None:
        state: SchemaState = "empty"
    elif current == head:
        state = "current"
    else:
        state = "behind" if current in known_revisions() else "ahead"
    return SchemaStatus(current=current, head=head, state=state)


def schema_status(url: str) -> SchemaStatus:
    """Connect and report where the schema stands."""
    engine = create_sync_engine(url)
    try:
        with engine.connect() as connection:
            return status_on(connection)
    finally:
        engine.dispose()


@contextmanager
def _sqlite_file_lock(url: str) -> Iterator[None]:
    database = make_url(url).database
    if not database or database == ":memory:":
        yield
        return
    lock_path = Path(database).with_suffix(".migrate.lock")
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def upgrade_to(url: str, revision: str = "head") -> SchemaStatus:
    """Apply pending migrations up to `revision` under the migration lock; return the new status.

    Refuses a database migrated past this build (a newer node upgraded it).
    """
    engine = create_sync_engine(url)
    try:
        with _sqlite_file_lock(url) if dialect_of(url) == "sqlite" else _null_context():
            with engine.begin() as connection:
                if connection.dialect.name == "postgresql":
                    connection.execute(text("SELECT pg_advisory_xact_lock(:id)"), {"id": MIGRATION_LOCK_ID})
                before = status_on(connection)
                if before.state == "ahead":
                    raise MigrationError(
                        f"the database schema is newer than this build ({before.describe()}); upgrade Conveyor"
                    )
                config = alembic_config()
                config.attributes["connection"] = connection
                command.upgrade(config, revision)
            with engine.connect() as connection:
                return status_on(connection)
    finally:
        engine.dispose()


def downgrade_to(url: str, revision: str) -> None:
    """Move the schema back to `revision` (tests use it to make a database one migration behind)."""
    engine = create_sync_engine(url)
    try:
        with engine.begin() as connection:
            config = alembic_config()
            config.attributes["connection"] = connection
            command.downgrade(config, revision)
    finally:
        engine.dispose()


@contextmanager
def _null_context() -> Iterator[None]:
    yield
