"""SQL of dashboard sessions and their signing key."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import delete, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.db.tables import admin_tokens, cluster_meta, dashboard_sessions

SESSION_KEY_META = "dashboard_session_key"


async def session_key(conn: AsyncConnection, now: datetime) -> bytes:
    """The cookie-signing key shared by every coordinator, created by whichever asks first."""
    found = (
        await conn.execute(select(cluster_meta.c.value).where(cluster_meta.c.key == SESSION_KEY_META))
    ).scalar()
    if found:
        return bytes.fromhex(found)
    try:
        async with conn.begin_nested():
            value = secrets.token_hex(32)
            await conn.execute(
                cluster_meta.insert().values(key=SESSION_KEY_META, value=value, created_at=now)
            )
    except IntegrityError:
        value = (
            await conn.execute(select(cluster_meta.c.value).where(cluster_meta.c.key == SESSION_KEY_META))
        ).scalar_one()
    return bytes.fromhex(value)


async def insert_session(
    conn: AsyncConnection, *, sid: str, token_id: str, csrf_token: str, now: datetime, remote: str | None
) -> None:
    """Record a new signed-in browser."""
    await conn.execute(
        dashboard_sessions.insert().values(
            id=sid,
            token_id=token_id,
            csrf_token=csrf_token,
            created_at=now,
            last_seen_at=now,
            remote_addr=(remote or "")[:64] or None,
        )
    )


@dataclass(frozen=True)
class SessionRow:
    """A session with the live state of its token."""

    id: str
    token_id: str
    csrf_token: str
    last_seen_at: datetime
    label: str | None
    role: str | None
    routing_key: str | None
    revoked_at: datetime | None
    expires_at: datetime | None
    token_exists: bool

    def token_live(self, now: datetime) -> bool:
        """The token still exists, is not revoked and not expired."""
        return (
            self.token_exists
            and self.revoked_at is None
            and (self.expires_at is None or self.expires_at > now)
        )


async def find_session(conn: AsyncConnection, sid: str) -> SessionRow | None:
    """A session joined with its token (one indexed lookup each)."""
    query = (
        select(
            dashboard_sessions.c.id,
            dashboard_sessions.c.token_id,
            dashboard_sessions.c.csrf_token,
            dashboard_sessions.c.last_seen_at,
            admin_tokens.c.id.label("found_token"),
            admin_tokens.c.label,
            admin_tokens.c.role,
            admin_tokens.c.routing_key,
            admin_tokens.c.revoked_at,
            admin_tokens.c.expires_at,
        )
        .select_from(
            dashboard_sessions.outerjoin(admin_tokens, admin_tokens.c.id == dashboard_sessions.c.token_id)
        )
        .where(dashboard_sessions.c.id == sid)
    )
    row = (await conn.execute(query)).first()
    if row is None:
        return None
    return SessionRow(
        id=row.id,
        token_id=row.token_id,
        csrf_token=row.csrf_token,
        last_seen_at=row.last_seen_at,
        label=row.label,
        role=row.role,
        routing_key=row.routing_key,
        revoked_at=row.revoked_at,
        expires_at=row.expires_at,
        token_exists=row.found_token is not None,
    )


async def touch_session(conn: AsyncConnection, sid: str, now: datetime) -> None:
    """Move the idle clock on."""
    await conn.execute(
        update(dashboard_sessions).where(dashboard_sessions.c.id == sid).values(last_seen_at=now)
    )


async def delete_session(conn: AsyncConnection, sid: str) -> None:
    """Sign out one browser."""
    await conn.execute(delete(dashboard_sessions).where(dashboard_sessions.c.id == sid))


async def delete_idle_sessions(conn: AsyncConnection, older_than: datetime) -> int:
    """Drop sessions idle since before `older_than`; returns how many."""
    result = await conn.execute(
        delete(dashboard_sessions).where(dashboard_sessions.c.last_seen_at < older_than)
    )
    return result.rowcount or 0
