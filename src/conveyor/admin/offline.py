"""Offline admin actions that talk to the database directly (`token bootstrap`), and the opening of a database
for such an action that every one shares (`registration register-manual --database-url` too)."""

from __future__ import annotations

import asyncio

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


async def bootstrap_owner_offline(database_url: str, *, label: str | None) -> str:
    """Create an owner token and its `cli_offline` access-log row; return the plaintext."""
    db = await open_current_database(database_url)
    try:
        async with db.transaction() as conn:
            token, row = await insert_token(
                conn, role="owner", created_by="bootstrap", label=label or "offline bootstrap"
            )
            entry = AccessEntry(
                action="tokens.bootstrap",
                outcome="allowed",
                status_code=201,
                source="cli_offline",
                actor_type="cli_offline",
                permission="token.manage",
                target_type="admin_token",
                target_id=row.id,
            )
            await insert_access_rows(conn, [entry.as_row()])
    finally:
        await db.dispose()
    return token
