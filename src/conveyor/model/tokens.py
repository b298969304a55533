"""What the database keeps of a bearer credential (admin, agent and job tokens alike)."""

from __future__ import annotations

import hashlib


def hash_token(token: str) -> str:
    """SHA-256 hex of a token: the only form stored."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()
