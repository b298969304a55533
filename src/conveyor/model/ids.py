"""Identifiers and timestamps: UUIDv7 strings and UTC times with millisecond precision."""

import os
from datetime import UTC, datetime
from pathlib import Path

import uuid6


def new_id() -> str:
    """Return a new time-ordered UUIDv7 as a string."""
    return str(uuid6.uuid7())


def utc_now() -> datetime:
    """Return the current UTC time truncated to milliseconds (the precision we store)."""
    return truncate_to_ms(datetime.now(UTC))


def truncate_to_ms(value: datetime) -> datetime:
    """Drop sub-millisecond digits so a stored value compares equal to the one we hold."""
    return value.replace(microsecond=value.microsecond - value.microsecond % 1000)


def format_rfc3339(value: datetime) -> str:
    """Format as RFC 3339 UTC with milliseconds: `2025-03-01T12:00:00.123Z`."""
    value = value.astimezone(UTC)
    return value.strftime("%Y-%m-%dT%H:%M:%S.") + f"{value.microsecond // 1000:03d}Z"


def stored_id(path: Path, configured: str | None = None) -> str:
    """`configured` when given, else the id kept in `path`, made once (a new UUIDv7) if there is none.

    An agent's and a server's identity across restarts. Written to a temporary file and renamed, so a
    crash never leaves a half-written id behind.
    """
    if configured:
        return configured
    try:
        existing = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        existing = ""
    if existing:
        return existing
    path.parent.mkdir(parents=True, exist_ok=True)
    made = new_id()
    temporary = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    temporary.write_text(made + "\n", encoding="utf-8")
    os.replace(temporary, path)
    return made
