"""Teardown reattempts (docs/design/scaler.md §3, "Teardown reattempts"), pure: which failed teardowns are due.

A teardown that failed (an agent process that would not die, a container the engine would not remove, a VM
whose stop raised) is tried again every `scaler_reap_reattempt_interval_ms` until it succeeds: its spawn
record is closed at the first attempt (the token revoked, the job freed), but the compute is still there.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class FailedTeardown:
    """One teardown that failed and waits for its next attempt (monotonic seconds)."""

    key: str
    attempts: int
    last_attempt_at: float
    in_flight: bool = False


def due_teardowns(failed: Iterable[FailedTeardown], *, now: float, interval_ms: int) -> list[str]:
    """The keys due for another attempt at `now`, longest waiting first; one under way is never due."""
    due = [
        teardown
        for teardown in failed
        if not teardown.in_flight and now - teardown.last_attempt_at >= interval_ms / 1000
    ]
    return [teardown.key for teardown in sorted(due, key=lambda t: (t.last_attempt_at, t.key))]
