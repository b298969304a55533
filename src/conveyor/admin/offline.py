"""Offline admin actions that talk to the database directly (`token bootstrap`), and what every such action
shares (`registration register-manual --database-url` too): its transaction on a current database and its
`cli_offline` access-log row."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.admin.store import insert_access_rows, insert_token
from conveyor.db.engine import Database
from conveyor.db.migrate import schema_status
from conveyor.errors import ConveyorError
from conveyor.http.deps import AccessEntry


class OfflineError(ConveyorError):
    """The offline action cannot run; the message says why and what to do."""


async def open_current_database(database_url: str) -> Database:
    """The database at `database_url`, refused unless reachable and migrated to this build's head."""
    try:
        status = await asyncio.to_thread(schema_status, database_url)
    except Exception as exc:
        raise OfflineError(f"cannot reach the database: {exc}") from exc
    if status.state != "current":
        raise OfflineError(
            f"the database schema is not current ({status.describe()}); run `conveyor admin db migrate` first"
        )
    return Database.connect(database_url, pool_size=1)


@asynccontextmanager
async def offline_transaction(database_url: str) -> AsyncIterator[AsyncConnection]:
    """One transaction on the database at `database_url` (`open_current_database`), disposed of after."""
    db = await open_current_database(database_url)
    try:
        async with db.transaction() as conn:
            yield conn
    finally:
        await db.dispose()


async def log_offline_action(
    conn: AsyncConnection,
    *,
    action: str,
    status_code: int,
    permission: str,
    target_type: str,
    target_id: str,
) -> None:
    """The access-log row of an allowed offline action: `source` and actor `cli_offline`."""
    entry = AccessEntry(
        action=action,
        outcome="allowed",
        status_code=status_code,
        source="cli_offline",
        actor_type="cli_offline",
        permission=permission,
        target_type=target_type,
        target_id=target_id,
    )
    await insert_access_rows(conn, [entry.as_row()])


async def bootstrap_owner_offline(database_url: str, *, label: str | None) -> str:
    """Create an owner token and its `cli_offline` access-log row; return the plaintext."""
    async with offline_transaction(database_url) as conn:
        token, row = await insert_token(
            conn, role="owner", created_by="bootstrap", label=label or "offline bootstrap"
        )
        await log_offline_action(
            conn,
            action="tokens.bootstrap",
            status_code=201,
            permission="token.manage",
            target_type="admin_token",
            target_id=row.id,
        )
    return token
