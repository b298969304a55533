"""Durations as written by authors (`"1h30m"`, seconds, `timedelta`) converted to milliseconds."""

from __future__ import annotations

import re
from datetime import timedelta

from conveyor.sdk.errors import authoring_error

DurationLike = int | float | timedelta | str

_DURATION_RE = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?(?:(\d+)ms)?$")
MAX_DURATION_MS = 7 * 24 * 3600 * 1000


def duration_ms(value: DurationLike, *, what: str) -> int:
    """Parse a duration into whole milliseconds; anything invalid, ≤ 0 or over 7 days is E113."""
    if isinstance(value, bool):
        raise authoring_error("E113", f"{what}: a duration cannot be a bool")
    if isinstance(value, timedelta):
        ms = round(value.total_seconds() * 1000)
    elif isinstance(value, int | float):
        ms = round(value * 1000)
    elif isinstance(value, str):
        found = _DURATION_RE.match(value)
        if not value or found is None:
            raise authoring_error(
                "E113", f"{what}: {value!r} is not a duration (use e.g. '1h30m', '20m', '2s', '500ms')"
            )
        hours, minutes, seconds, millis = (int(part) if part else 0 for part in found.groups())
        ms = ((hours * 60 + minutes) * 60 + seconds) * 1000 + millis
    else:
        raise authoring_error("E113", f"{what}: {value!r} is not a duration")
    if ms <= 0:
        raise authoring_error("E113", f"{what}: a duration must be greater than zero")
    if ms > MAX_DURATION_MS:
        raise authoring_error("E113", f"{what}: a duration must be at most 7 days")
    return ms


def optional_duration_ms(value: DurationLike | None, *, what: str) -> int | None:
    """`duration_ms`, letting `None` through as "no limit"."""
    return None if value is None else duration_ms(value, what=what)
