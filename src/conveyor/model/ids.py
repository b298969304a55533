"""Identifiers and timestamps: UUIDv7 strings and UTC times with millisecond precision."""

from datetime import UTC, datetime

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
