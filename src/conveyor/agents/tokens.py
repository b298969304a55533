"""Agent token values and registration label rules (pure; docs/design/execution.md §6, docs/design/scaler.md).

A token is `cvy_agent_` and 64 hex characters, shown once; only its SHA-256 and a 12-character
display prefix are stored. Labels are compared after `normalise_labels`, everywhere.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from conveyor.admin.tokens import hash_token

__all__ = [
    "AGENT_TOKEN_PREFIX",
    "AUTOMATIC_LABEL_PREFIXES",
    "AgentAuthRefusal",
    "AgentTokenRow",
    "RefusalReason",
    "check_registration_labels",
    "display_prefix",
    "generate_agent_token",
    "hash_token",
    "looks_like_agent_token",
    "normalise_labels",
]

AGENT_TOKEN_PREFIX = "cvy_agent_"
_TOKEN_PATTERN = re.compile(r"^cvy_agent_[0-9a-f]{64}$")

# The labels an agent adds about itself; the only `conveyor:` labels a registration may carry.
AUTOMATIC_LABEL_PREFIXES = ("conveyor:os:", "conveyor:arch:", "conveyor:host:")
RESERVED_PREFIX = "conveyor:"

RefusalReason = Literal["unknown_token", "revoked", "expired", "consumed"]


@dataclass(frozen=True)
class AgentTokenRow:
    """An agent token's stored metadata (every column of `agent_tokens` except the hash)."""

    id: str
    org_id: str
    label: str | None
    kind: str
    prefix: str
    labels: list[str]
    mandatory_labels: list[str]
    agent_id: str | None
    single_use: bool
    consumed_at: datetime | None
    created_by: str
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    last_used_at: datetime | None

    def is_live(self, now: datetime) -> bool:
        """Neither revoked, expired nor consumed at `now`."""
        return (
            self.revoked_at is None
            and (self.expires_at is None or self.expires_at > now)
            and not (self.single_use and self.consumed_at is not None)
        )


@dataclass(frozen=True)
class AgentAuthRefusal:
    """Why a presented token was refused (sent as `auth.failure {reason}`, then close 4010)."""

    reason: RefusalReason
    token_id: str | None = None


def generate_agent_token() -> str:
    """A new token: `cvy_agent_` and 32 random bytes as hex."""
    return AGENT_TOKEN_PREFIX + secrets.token_hex(32)


def display_prefix(token: str) -> str:
    """The first 12 characters, enough to recognise a token in a list."""
    return token[:12]


def looks_like_agent_token(value: str) -> bool:
    """Whether a value has the agent token's shape (anything else is refused without a lookup)."""
    return bool(_TOKEN_PATTERN.match(value))


def normalise_labels(labels: Iterable[str]) -> list[str]:
    """Strip, lowercase, drop empties and duplicates, sort."""
    return sorted({label.strip().lower() for label in labels if label.strip()})


def is_automatic_label(label: str) -> bool:
    """`conveyor:os:*`, `conveyor:arch:*` or `conveyor:host:*` with a non-empty value."""
    return any(label.startswith(p) and len(label) > len(p) for p in AUTOMATIC_LABEL_PREFIXES)


def check_registration_labels(token: AgentTokenRow, requested: list[str]) -> str | None:
    """None when an agent holding `token` may register `requested`, else the refusal reason.

    Refused: a `conveyor:` label other than the three automatic kinds, and any other label outside
    the token's `labels` (for an ephemeral token, its bound set).
    """
    allowed = set(normalise_labels(token.labels))
    for label in normalise_labels(requested):
        if label.startswith(RESERVED_PREFIX):
            if not is_automatic_label(label):
                return f"label_reserved: {label} (agents may add only conveyor:os:*, conveyor:arch:*, conveyor:host:*)"
            continue
        if label not in allowed:
            what = "the bound set" if token.kind == "ephemeral" else "the token's labels"
            shown = ", ".join(sorted(allowed)) or "none"
            return f"label_not_allowed: {label} is outside {what} ({shown})"
    return None
