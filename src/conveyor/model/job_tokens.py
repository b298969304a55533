"""A job's artifact credential (docs/design/artifacts.md §4): minted at dispatch, stored only as its
SHA-256 on the job's `dispatch_queue` row, good for that dispatch of that job only."""

from __future__ import annotations

import secrets

JOB_TOKEN_PREFIX = "cvy_job_"


def mint_job_token() -> str:
    """A new credential: `cvy_job_` and 64 hex digits (32 random bytes)."""
    return JOB_TOKEN_PREFIX + secrets.token_hex(32)


def looks_like_job_token(token: str) -> bool:
    """Whether `token` has a job credential's shape (anything else is refused before a lookup)."""
    body = token[len(JOB_TOKEN_PREFIX) :]
    return (
        token.startswith(JOB_TOKEN_PREFIX) and len(body) == 64 and all(c in "0123456789abcdef" for c in body)
    )
