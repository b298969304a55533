"""All SQL of the admin package: admin tokens, the owner bootstrap and the access log."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import and_, delete, func, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.admin.pagination import keyset_page, next_cursor
from conveyor.admin.tokens import display_prefix, generate_admin_token, hash_token
from conveyor.db.tables import access_log, admin_tokens, cluster_meta
from conveyor.model.ids import new_id, utc_now

OWNER_BOOTSTRAP_KEY = "owner_token_bootstrapped"


@dataclass(frozen=True)
class TokenRow:
    """An admin token's metadata (never its hash)."""

    id: str
    prefix: str
    label: str | None
    role: str
    routing_key: str | None
    created_by: str
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    last_used_at: datetime | None

    def is_live(self, now: datetime) -> bool:
        """Neither revoked nor expired at `now`."""
        return self.revoked_at is None and (self.expires_at is None or self.expires_at > now)


_TOKEN_COLUMNS = (
    admin_tokens.c.id,
    admin_tokens.c.prefix,
    admin_tokens.c.label,
    admin_tokens.c.role,
    admin_tokens.c.routing_key,
    admin_tokens.c.created_by,
    admin_tokens.c.created_at,
    admin_tokens.c.expires_at,
    admin_tokens.c.revoked_at,
    admin_tokens.c.last_used_at,
)


def _token(row: Any) -> TokenRow:
    return TokenRow(**dict(row._mapping))


async def insert_token(
    conn: AsyncConnection,
    *,
    role: str,
    created_by: str,
    label: str | None = None,
    routing_key: str | None = None,
    expires_at: datetime | None = None,
) -> tuple[str, TokenRow]:
    """Mint a token; return its plaintext (shown once) and its stored metadata."""
    plaintext = generate_admin_token()
    token = TokenRow(
        id=new_id(),
        prefix=display_prefix(plaintext),
        label=label,
        role=role,
        routing_key=routing_key,
        created_by=created_by,
        created_at=utc_now(),
        expires_at=expires_at,
        revoked_at=None,
        last_used_at=None,
    )
    await conn.execute(insert(admin_tokens).values(**token.__dict__, token_hash=hash_token(plaintext)))
    return plaintext, token


async def find_token_by_hash(conn: AsyncConnection, token_hash: str) -> TokenRow | None:
    """One indexed lookup; no cache, so a revocation takes effect at once."""
    result = await conn.execute(select(*_TOKEN_COLUMNS).where(admin_tokens.c.token_hash == token_hash))
    row = result.first()
    return _token(row) if row else None


async def get_token(conn: AsyncConnection, token_id: str) -> TokenRow | None:
    """A token's metadata by id."""
    row = (await conn.execute(select(*_TOKEN_COLUMNS).where(admin_tokens.c.id == token_id))).first()
    return _token(row) if row else None


async def list_tokens(conn: AsyncConnection) -> list[TokenRow]:
    """Every token, newest first."""
    result = await conn.execute(
        select(*_TOKEN_COLUMNS).order_by(admin_tokens.c.created_at.desc(), admin_tokens.c.id.desc())
    )
    return [_token(row) for row in result]


async def count_live_owners(conn: AsyncConnection, now: datetime) -> int:
    """How many owner tokens are neither revoked nor expired."""
    query = select(func.count()).where(
        and_(
            admin_tokens.c.role == "owner",
            admin_tokens.c.revoked_at.is_(None),
            (admin_tokens.c.expires_at.is_(None)) | (admin_tokens.c.expires_at > now),
        )
    )
    return int((await conn.execute(query)).scalar_one())


async def revoke_token(conn: AsyncConnection, token_id: str, now: datetime) -> bool:
    """Mark a live token revoked; False when it was already revoked or does not exist."""
    result = await conn.execute(
        update(admin_tokens)
        .where(admin_tokens.c.id == token_id, admin_tokens.c.revoked_at.is_(None))
        .values(revoked_at=now)
    )
    return result.rowcount == 1


async def touch_token(conn: AsyncConnection, token_id: str, now: datetime) -> None:
    """Record use; callers throttle this to once a minute."""
    await conn.execute(update(admin_tokens).where(admin_tokens.c.id == token_id).values(last_used_at=now))


async def bootstrap_owner_token(conn: AsyncConnection) -> str | None:
    """Create the first owner token unless some node already did; return its plaintext if we won.

    The unique `cluster_meta` key written in the same transaction makes this happen once per
    database, whichever coordinator gets there first and even if every owner token is revoked later.
    """
    try:
        async with conn.begin_nested():
            await conn.execute(
                insert(cluster_meta).values(key=OWNER_BOOTSTRAP_KEY, value=None, created_at=utc_now())
            )
    except IntegrityError:
        return None
    plaintext, row = await insert_token(conn, role="owner", created_by="bootstrap", label="bootstrap owner")
    await conn.execute(
        update(cluster_meta).where(cluster_meta.c.key == OWNER_BOOTSTRAP_KEY).values(value=row.id)
    )
    return plaintext


async def insert_access_rows(conn: AsyncConnection, rows: Sequence[Mapping[str, Any]]) -> None:
    """Write access-log rows (ids and timestamps must already be set)."""
    if rows:
        await conn.execute(insert(access_log), [dict(r) for r in rows])


async def page_access_log(
    conn: AsyncConnection,
    *,
    filters: Mapping[str, Any],
    limit: int,
    cursor: str | None,
) -> tuple[list[dict[str, Any]], str | None]:
    """One page of the access log, newest first, with equality filters and `since`/`before`."""
    query = select(access_log)
    for name in ("actor_id", "action", "outcome", "target_type", "target_id", "source"):
        if filters.get(name) is not None:
            query = query.where(access_log.c[name] == filters[name])
    if filters.get("since") is not None:
        query = query.where(access_log.c.at >= filters["since"])
    if filters.get("before") is not None:
        query = query.where(access_log.c.at < filters["before"])
    query = keyset_page(query, access_log.c.at, access_log.c.id, limit=limit, cursor=cursor, filters=filters)
    rows = list((await conn.execute(query)).all())
    following = next_cursor(rows, limit, "at", filters)
    return [dict(r._mapping) for r in rows], following


async def get_access_row(conn: AsyncConnection, row_id: str) -> dict[str, Any] | None:
    """One access-log row."""
    row = (await conn.execute(select(access_log).where(access_log.c.id == row_id))).first()
    return dict(row._mapping) if row else None


async def delete_access_log_before(conn: AsyncConnection, cutoff: datetime, limit: int) -> int:
    """Delete up to `limit` access-log rows older than `cutoff`, oldest first (`audit_retention_days`)."""
    some = select(access_log.c.id).where(access_log.c.at < cutoff).order_by(access_log.c.at).limit(limit)
    result = await conn.execute(delete(access_log).where(access_log.c.id.in_(some)))
    return int(result.rowcount or 0)
