"""Single-use claims of the `event` scaler backend (docs/design/scaler.md §6.4).

A claim stands for one spawned agent whose machine a provisioning workflow creates: the code goes
out once in `conveyor.scaler.scale_up`, only its SHA-256 is stored, and redeeming it
(`POST /api/v1/agents/claim`) gives the new machine an agent token bound to the spawn's agent id
and labels. The pure parts (codes, the per-address throttle, retention) are I/O-free; the SQL
functions run in the caller's transaction.
"""

from __future__ import annotations

import hashlib
import secrets
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, delete, insert, or_, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.agents.tokens import display_prefix, generate_agent_token, hash_token
from conveyor.db.tables import agent_tokens, scaler_claims, scaler_spawns

CLAIM_PREFIX = "cvy_claim_"
DEFAULT_CLAIM_TTL_S = 300
# The claim route accepts this many attempts per remote address per window.
THROTTLE_ATTEMPTS = 10
THROTTLE_WINDOW_S = 60.0
MAX_CODE_CHARS = 200


def generate_claim_code() -> str:
    """`cvy_claim_` and 32 random bytes as hex."""
    return CLAIM_PREFIX + secrets.token_hex(32)


def hash_code(code: str) -> str:
    """SHA-256 hex of a claim code: the only form stored."""
    return hashlib.sha256(code.encode("utf-8")).hexdigest()


@dataclass
class ClaimThrottle:
    """At most `attempts` claim attempts per remote address within `window_s` (a sliding window).

    `allow(address, now)` records an attempt and answers None when it may proceed, else the seconds
    until the oldest attempt of the window leaves it. Addresses with no attempt in the window are
    forgotten, so the map stays as small as the set of recent callers.
    """

    attempts: int = THROTTLE_ATTEMPTS
    window_s: float = THROTTLE_WINDOW_S
    _seen: dict[str, deque[float]] = field(default_factory=dict)

    def allow(self, address: str, now: float) -> float | None:
        for known in [a for a, times in self._seen.items() if not times or times[-1] <= now - self.window_s]:
            del self._seen[known]
        times = self._seen.setdefault(address, deque())
        while times and times[0] <= now - self.window_s:
            times.popleft()
        if len(times) >= self.attempts:
            return max(0.001, times[0] + self.window_s - now)
        times.append(now)
        return None


def purge_before(now: datetime, retention_ms: int) -> datetime:
    """Claims consumed or expired before this instant are deleted."""
    return now - timedelta(milliseconds=retention_ms)


async def insert_claim(
    conn: AsyncConnection, *, agent_id: str, code: str, scaler: str, url: str, now: datetime, ttl_s: float
) -> datetime:
    """Store the claim of a spawn; return its expiry."""
    expires_at = now + timedelta(seconds=ttl_s)
    await conn.execute(
        insert(scaler_claims).values(
            agent_id=agent_id,
            code_sha256=hash_code(code),
            scaler=scaler,
            url=url,
            created_at=now,
            expires_at=expires_at,
            consumed_at=None,
        )
    )
    return expires_at


async def expire_claim(conn: AsyncConnection, agent_id: str, now: datetime) -> None:
    """An unredeemed claim of a destroyed spawn can no longer be redeemed."""
    await conn.execute(
        update(scaler_claims)
        .where(
            scaler_claims.c.agent_id == agent_id,
            scaler_claims.c.consumed_at.is_(None),
            scaler_claims.c.expires_at > now,
        )
        .values(expires_at=now)
    )


@dataclass(frozen=True)
class Redeemed:
    """What a redeemed claim gives the new machine."""

    agent_id: str
    token: str
    url: str
    labels: list[str]
    expires_at: datetime


async def redeem(conn: AsyncConnection, code: str, now: datetime, token_ttl_ms: int) -> Redeemed | None:
    """Consume the claim and mint the agent's token; None for an unknown, used or expired code.

    The claim is consumed by a conditional UPDATE (one of two concurrent redeemers wins). The token
    is the spawn's own ephemeral token row, given a fresh secret and expiry: it stays bound to the
    spawn's agent id and labels, single use, and the manager revokes it when the spawn ends.
    """
    if not code or len(code) > MAX_CODE_CHARS:
        return None
    digest = hash_code(code)
    consumed = await conn.execute(
        update(scaler_claims)
        .where(
            scaler_claims.c.code_sha256 == digest,
            scaler_claims.c.consumed_at.is_(None),
            scaler_claims.c.expires_at > now,
        )
        .values(consumed_at=now)
    )
    if consumed.rowcount != 1:
        return None
    claim = (await conn.execute(select(scaler_claims).where(scaler_claims.c.code_sha256 == digest))).one()
    spawn = (
        await conn.execute(
            select(scaler_spawns.c.token_id, scaler_spawns.c.state).where(
                scaler_spawns.c.agent_id == claim.agent_id
            )
        )
    ).first()
    if spawn is None or spawn.token_id is None or spawn.state != "spawning":
        return None
    token = generate_agent_token()
    expires_at = now + timedelta(milliseconds=token_ttl_ms)
    rotated = await conn.execute(
        update(agent_tokens)
        .where(
            agent_tokens.c.id == spawn.token_id,
            agent_tokens.c.agent_id == claim.agent_id,
            agent_tokens.c.revoked_at.is_(None),
            agent_tokens.c.consumed_at.is_(None),
        )
        .values(token_hash=hash_token(token), prefix=display_prefix(token), expires_at=expires_at)
    )
    if rotated.rowcount != 1:
        return None
    labels: Any = (
        await conn.execute(select(agent_tokens.c.labels).where(agent_tokens.c.id == spawn.token_id))
    ).scalar_one()
    return Redeemed(claim.agent_id, token, claim.url, list(labels or []), expires_at)


async def delete_old_claims(conn: AsyncConnection, before: datetime) -> int:
    """Delete claims consumed or expired before `before`; return how many."""
    result = await conn.execute(
        delete(scaler_claims).where(
            or_(
                and_(scaler_claims.c.consumed_at.is_not(None), scaler_claims.c.consumed_at < before),
                scaler_claims.c.expires_at < before,
            )
        )
    )
    return int(result.rowcount or 0)
