"""The worker's agent tokens: `cvy_agent_` tokens minted for its own spawns, in memory as SHA-256 only."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from conveyor.agents.tokens import (
    AgentAuthRefusal,
    AgentTokenRow,
    display_prefix,
    generate_agent_token,
    looks_like_agent_token,
)
from conveyor.model.ids import new_id, utc_now


@dataclass
class _HeldToken:
    row: AgentTokenRow


class MemoryAgentTokens:
    """`cvy_agent_` tokens this worker mints for its own spawns; only their SHA-256 is kept."""

    def __init__(self, clock: Callable[[], datetime] = utc_now) -> None:
        self.clock = clock
        self._by_hash: dict[str, _HeldToken] = {}
        self._by_id: dict[str, _HeldToken] = {}

    def mint(
        self,
        *,
        labels: list[str],
        mandatory_labels: list[str],
        agent_id: str,
        expires_at: datetime,
        label: str,
    ) -> tuple[str, str]:
        """A new single-use ephemeral token bound to `agent_id`: `(token, token_id)`."""
        token = generate_agent_token()
        now = self.clock()
        row = AgentTokenRow(
            id=new_id(),
            org_id="default",
            label=label,
            kind="ephemeral",
            prefix=display_prefix(token),
            labels=list(labels),
            mandatory_labels=list(mandatory_labels),
            agent_id=agent_id,
            single_use=True,
            consumed_at=None,
            created_by=label[:64],
            created_at=now,
            expires_at=expires_at,
            revoked_at=None,
            last_used_at=None,
        )
        held = _HeldToken(row)
        self._by_hash[hashlib.sha256(token.encode()).hexdigest()] = held
        self._by_id[row.id] = held
        return token, row.id

    def authenticate(self, token: str) -> AgentTokenRow | AgentAuthRefusal:
        """Shape, hash lookup, revocation, expiry, single use (consumed here)."""
        if not looks_like_agent_token(token):
            return AgentAuthRefusal("unknown_token")
        held = self._by_hash.get(hashlib.sha256(token.encode()).hexdigest())
        if held is None:
            return AgentAuthRefusal("unknown_token")
        row, now = held.row, self.clock()
        if row.revoked_at is not None:
            return AgentAuthRefusal("revoked", row.id)
        if row.expires_at is not None and row.expires_at <= now:
            return AgentAuthRefusal("expired", row.id)
        if row.single_use and row.consumed_at is not None:
            return AgentAuthRefusal("consumed", row.id)
        held.row = _replace(row, consumed_at=now, last_used_at=now)
        return held.row

    def bind(self, token_id: str, agent_id: str) -> str | None:
        """An agent id belongs to the live token bound to it; a token serves one agent id."""
        now = self.clock()
        for other in self._by_id.values():
            row = other.row
            if (
                row.id != token_id
                and row.agent_id == agent_id
                and row.revoked_at is None
                and (row.expires_at is None or row.expires_at > now)
            ):
                return f"agent id {agent_id} is bound to another live token ({row.prefix}…)"
        held = self._by_id.get(token_id)
        if held is None or (held.row.agent_id is not None and held.row.agent_id != agent_id):
            return f"this token is bound to another agent id than {agent_id}"
        held.row = _replace(held.row, agent_id=agent_id)
        return None

    def revoke(self, token_id: str) -> None:
        """Forget a token (its agent's life ended)."""
        held = self._by_id.pop(token_id, None)
        if held is not None:
            self._by_hash = {h: t for h, t in self._by_hash.items() if t is not held}

    def __len__(self) -> int:
        return len(self._by_id)


def _replace(row: AgentTokenRow, **changes: Any) -> AgentTokenRow:
    return replace(row, **changes)
