"""Durations and times as people read them (the CLI's tables and the dashboard's pages)."""

from __future__ import annotations

from datetime import datetime
from typing import Any


def parse_time(value: Any) -> datetime | None:
    """A datetime, or an ISO-8601 string of one (the API's JSON); None for anything else."""
    if isinstance(value, datetime):
        return value
    if isinstance(value, str) and value:
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
    return None


def duration_text(started: Any, finished: Any) -> str:
    """`1.2 s`, `3 min 4 s`, `2 h 5 min`; empty when it has not started or not finished."""
    begin, end = parse_time(started), parse_time(finished)
    if begin is None or end is None:
        return ""
    seconds = max(0.0, (end - begin).total_seconds())
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 60:
        return f"{int(seconds)} s"
    minutes, rest = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {rest} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"
