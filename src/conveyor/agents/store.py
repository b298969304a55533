"""All SQL of agent tokens and the `agents` table (docs/design/execution.md §3, §6).

The endpoint calls `authenticate_agent_token` and `bind_agent_id` during the handshake; the admin
routes and the scaler mint and revoke through the same functions.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import exists, func, insert, literal_column, or_, select, text, type_coerce, update
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.admin.pagination import encode_cursor, keyset_page
from conveyor.agents.tokens import (
    AgentAuthRefusal,
    AgentTokenRow,
    RefusalReason,
    display_prefix,
    generate_agent_token,
    hash_token,
    looks_like_agent_token,
    normalise_labels,
)
from conveyor.db.tables import DEFAULT_ORG, agent_tokens, agents
from conveyor.model.ids import new_id, utc_now

# `last_used_at` of a reusable token is refreshed at most this often (a reconnect storm writes little).
TOUCH_INTERVAL = timedelta(minutes=1)

_TOKEN_COLUMNS = tuple(c for c in agent_tokens.c if c.name != "token_hash")


def _token(row: Any) -> AgentTokenRow:
    return AgentTokenRow(**dict(row._mapping))


async def mint_agent_token(
    conn: AsyncConnection,
    *,
    labels: list[str],
    mandatory_labels: list[str],
    label: str | None,
    created_by: str,
    kind: str = "static",
    single_use: bool = False,
    expires_at: datetime | None = None,
    agent_id: str | None = None,
) -> tuple[str, AgentTokenRow]:
    """Create a token; return its plaintext (shown once) and its stored metadata.

    Labels are normalised here; validating them against the rules of the caller (admin body, scaler
    spawn) is the caller's job.
    """
    if kind not in ("static", "ephemeral"):
        raise ValueError(f"unknown agent token kind {kind!r}")
    plaintext = generate_agent_token()
    token = AgentTokenRow(
        id=new_id(),
        org_id=DEFAULT_ORG,
        label=label,
        kind=kind,
        prefix=display_prefix(plaintext),
        labels=normalise_labels(labels),
        mandatory_labels=normalise_labels(mandatory_labels),
        agent_id=agent_id,
        single_use=single_use,
        consumed_at=None,
        created_by=created_by,
        created_at=utc_now(),
        expires_at=expires_at,
        revoked_at=None,
        last_used_at=None,
    )
    await conn.execute(insert(agent_tokens).values(**asdict(token), token_hash=hash_token(plaintext)))
    return plaintext, token


async def authenticate_agent_token(
    conn: AsyncConnection, token: str, now: datetime
) -> AgentTokenRow | AgentAuthRefusal:
    """Check a presented token: shape, hash lookup, revocation, expiry and single use.

    A single-use token is consumed by a conditional UPDATE, so of two connections racing with the
    same token exactly one gets the row back and the other is refused `consumed`. Commit `conn` for
    the consumption (and `last_used_at`) to stick.
    """
    if not looks_like_agent_token(token):
        return AgentAuthRefusal("unknown_token")
    found = (
        await conn.execute(select(*_TOKEN_COLUMNS).where(agent_tokens.c.token_hash == hash_token(token)))
    ).first()
    if found is None:
        return AgentAuthRefusal("unknown_token")
    row = _token(found)
    if row.revoked_at is not None:
        return AgentAuthRefusal("revoked", row.id)
    if row.expires_at is not None and row.expires_at <= now:
        return AgentAuthRefusal("expired", row.id)
    if row.single_use:
        consumed = await conn.execute(
            update(agent_tokens)
            .where(
                agent_tokens.c.id == row.id,
                agent_tokens.c.consumed_at.is_(None),
                agent_tokens.c.revoked_at.is_(None),
                or_(agent_tokens.c.expires_at.is_(None), agent_tokens.c.expires_at > now),
            )
            .values(consumed_at=now, last_used_at=now)
        )
        if consumed.rowcount != 1:
            return AgentAuthRefusal(await _why_not_consumable(conn, row.id, now), row.id)
        return AgentTokenRow(**{**asdict(row), "consumed_at": now, "last_used_at": now})
    if row.last_used_at is None or now - row.last_used_at >= TOUCH_INTERVAL:
        await conn.execute(update(agent_tokens).where(agent_tokens.c.id == row.id).values(last_used_at=now))
        row = AgentTokenRow(**{**asdict(row), "last_used_at": now})
    return row


async def _why_not_consumable(conn: AsyncConnection, token_id: str, now: datetime) -> RefusalReason:
    # The guarded UPDATE lost: another connection consumed the token first, or it was revoked or
    # expired between the lookup and the UPDATE. Re-read to name the right one.
    current = await get_agent_token(conn, token_id)
    if current is None or current.revoked_at is not None:
        return "revoked"
    if current.expires_at is not None and current.expires_at <= now:
        return "expired"
    return "consumed"


@dataclass(frozen=True)
class BindRefusal:
    """Why a registration may not take an agent id; `reason` is what the agent is told (4010)."""

    reason: str


async def bind_agent_id(
    conn: AsyncConnection, token_id: str, agent_id: str, now: datetime
) -> BindRefusal | None:
    """Bind the token to `agent_id` at first registration; a refusal when that would take an identity.

    An agent id belongs to the token it is bound to while that token is live (not revoked, not
    expired): another token may not register under it, or it could close the rightful agent and
    report on its jobs. Once the bound token is revoked or expired, a new token may bind the id (how
    an operator re-keys an agent). A token bound to one agent id never serves another.

    Two tokens racing for the same unbound id are serialised: SQLite write transactions already are
    (BEGIN IMMEDIATE); PostgreSQL takes a transaction-scoped advisory lock on the agent id first.
    """
    if conn.dialect.name == "postgresql":
        await conn.execute(
            text("SELECT pg_advisory_xact_lock(hashtext(:key))"), {"key": f"agent-id:{agent_id}"}
        )
    holder = (
        await conn.execute(
            select(agent_tokens.c.id, agent_tokens.c.prefix)
            .where(
                agent_tokens.c.agent_id == agent_id,
                agent_tokens.c.id != token_id,
                agent_tokens.c.revoked_at.is_(None),
                or_(agent_tokens.c.expires_at.is_(None), agent_tokens.c.expires_at > now),
            )
            .limit(1)
        )
    ).first()
    if holder is not None:
        return BindRefusal(
            f"agent id {agent_id} is bound to another live token ({holder.prefix}…); "
            "revoke that token to re-key the agent"
        )
    result = await conn.execute(
        update(agent_tokens)
        .where(
            agent_tokens.c.id == token_id,
            or_(agent_tokens.c.agent_id.is_(None), agent_tokens.c.agent_id == agent_id),
        )
        .values(agent_id=agent_id)
    )
    if result.rowcount != 1:
        return BindRefusal(f"this token is bound to another agent id than {agent_id}")
    return None


async def get_agent_token(conn: AsyncConnection, token_id: str) -> AgentTokenRow | None:
    """A token's metadata by id."""
    row = (await conn.execute(select(*_TOKEN_COLUMNS).where(agent_tokens.c.id == token_id))).first()
    return _token(row) if row else None


async def page_agent_tokens(
    conn: AsyncConnection, *, limit: int, cursor: str | None
) -> tuple[list[AgentTokenRow], str | None]:
    """Tokens newest first, one page."""
    query = select(*_TOKEN_COLUMNS)
    query = keyset_page(
        query, agent_tokens.c.created_at, agent_tokens.c.id, limit=limit, cursor=cursor, filters={}
    )
    rows = [_token(r) for r in await conn.execute(query)]
    following = None
    if len(rows) > limit:
        del rows[limit:]
        following = encode_cursor(rows[-1].created_at, rows[-1].id, {})
    return rows, following


async def revoke_agent_token(conn: AsyncConnection, token_id: str, now: datetime) -> bool:
    """Mark a token revoked; False when it was already revoked or does not exist."""
    result = await conn.execute(
        update(agent_tokens)
        .where(agent_tokens.c.id == token_id, agent_tokens.c.revoked_at.is_(None))
        .values(revoked_at=now)
    )
    return result.rowcount == 1


async def revoked_among(conn: AsyncConnection, token_ids: list[str]) -> set[str]:
    """Which of these token ids are revoked now (the hub's re-check of its live connections)."""
    if not token_ids:
        return set()
    rows = await conn.execute(
        select(agent_tokens.c.id).where(
            agent_tokens.c.id.in_(token_ids), agent_tokens.c.revoked_at.is_not(None)
        )
    )
    return {row.id for row in rows}


# --- the `agents` table (written by the endpoint; read here for the admin API)


def _has_label(conn: AsyncConnection, label: str) -> Any:
    if conn.dialect.name == "postgresql":
        return type_coerce(agents.c.labels, JSONB).contains([label])
    each = func.json_each(agents.c.labels).table_valued("value")
    return exists(select(literal_column("1")).select_from(each).where(each.c.value == label))


async def page_agents(
    conn: AsyncConnection, *, label: str | None, limit: int, cursor: str | None
) -> tuple[list[dict[str, Any]], str | None]:
    """Agents most recently seen for the first time first, optionally those carrying `label`."""
    filters = {"label": label}
    query = select(agents)
    if label is not None:
        query = query.where(_has_label(conn, label))
    query = keyset_page(
        query, agents.c.first_seen_at, agents.c.agent_id, limit=limit, cursor=cursor, filters=filters
    )
    rows = [dict(r._mapping) for r in await conn.execute(query)]
    following = None
    if len(rows) > limit:
        del rows[limit:]
        following = encode_cursor(rows[-1]["first_seen_at"], rows[-1]["agent_id"], filters)
    return rows, following


async def get_agent(conn: AsyncConnection, agent_id: str) -> dict[str, Any] | None:
    """One agent's row."""
    row = (await conn.execute(select(agents).where(agents.c.agent_id == agent_id))).first()
    return dict(row._mapping) if row else None
