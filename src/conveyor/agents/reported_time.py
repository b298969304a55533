"""Which moment to store for an agent's `job.started` / `step.started`: the agent's, when it is plausible.

The agent stamps these messages when the job or step actually started. The orchestrator applies an agent's
frames one at a time, so a start can be read several milliseconds (seconds, on a busy node or after a
replay) after it happened; the stored times should say when things ran. An agent's clock is trusted only
within `PLAUSIBLE_MS` before the moment the message is read, and never ahead of it: a skewed clock or an
old replay falls back to the time of reading.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

PLAUSIBLE_MS = 10_000


def reported_time(agent_ts_ms: float | None, now: datetime, plausible_ms: int = PLAUSIBLE_MS) -> datetime:
    """The agent's stamp (milliseconds since the epoch) if within [now - plausible_ms, now], else `now`."""
    if agent_ts_ms is None:
        return now
    try:
        stamped = datetime.fromtimestamp(agent_ts_ms / 1000, UTC)
    except (OverflowError, OSError, ValueError):
        return now
    if now - timedelta(milliseconds=plausible_ms) <= stamped <= now:
        return stamped
    return now
