"""Admin token values: generation, hashing and display prefix (pure)."""

from __future__ import annotations

import re
import secrets

from conveyor.model.tokens import hash_token as hash_token  # its callers' name for it

ADMIN_TOKEN_PREFIX = "cvy_admin_"
_TOKEN_PATTERN = re.compile(r"^cvy_admin_[0-9a-f]{64}$")


def generate_admin_token() -> str:
    """A new token: `cvy_admin_` and 32 random bytes as hex."""
    return ADMIN_TOKEN_PREFIX + secrets.token_hex(32)


def display_prefix(token: str) -> str:
    """The first 16 characters, enough to recognise a token in a list."""
    return token[:16]


def looks_like_admin_token(value: str) -> bool:
    """Whether a bearer value has the admin token's shape (a malformed one is `unauthenticated`)."""
    return bool(_TOKEN_PATTERN.match(value))


def malformed_token_detail(value: str) -> str:
    """Why a bearer value is not a well-formed admin token: a truncated or mangled `cvy_admin_…` value
    (a copy-paste accident) is malformed, not "not an admin token"."""
    if value.startswith(ADMIN_TOKEN_PREFIX):
        body = value[len(ADMIN_TOKEN_PREFIX) :]
        return (
            f"the admin token is malformed: {len(body)} characters after cvy_admin_, expected 64 hex "
            "characters (was it cut when copied?)"
        )
    return "the bearer value is not an admin token (cvy_admin_ and 64 hex characters)"
