"""Provision backoff (docs/design/scaler.md §3): after consecutive failures to provision an agent a scaler
waits, doubling up to a cap, and says so on the jobs it cannot serve meanwhile. Pure: the manager passes its
knobs and the clock.
"""

from __future__ import annotations

from datetime import UTC, datetime

from conveyor.scaler.manager.core import ScalerRuntime


def backoff_delay_ms(failures: int, base_ms: int, max_ms: int) -> int:
    """`min(base · 2^(n−1), max)` after `n` consecutive provisioning failures; 0 for none (pure)."""
    if failures <= 0:
        return 0
    return int(min(base_ms * 2 ** (failures - 1), max_ms))


def failure_message(detail: str, failures: int, max_consecutive: int) -> str:
    """The error as shown: from `max_consecutive` failures on it says how many in a row (pure)."""
    if failures >= max_consecutive:
        return f"repeated failure ({failures} in a row): {detail}"
    return detail


def open_backoff(
    runtime: ScalerRuntime, detail: str, *, base_ms: int, max_ms: int, max_consecutive: int, now: float
) -> tuple[int, str]:
    """Set the backoff window after `runtime.failures` failures in a row (counted by the caller), the error
    shown, and whether the scaler is failing; the window's length in ms and the error."""
    delay_ms = backoff_delay_ms(runtime.failures, base_ms, max(max_ms, base_ms))
    runtime.next_attempt_at = now + delay_ms / 1000
    runtime.backoff_ms = delay_ms
    runtime.last_error = message = failure_message(detail, runtime.failures, max_consecutive)
    runtime.failing = runtime.failures >= max_consecutive
    return delay_ms, message


def clear_backoff(runtime: ScalerRuntime) -> None:
    """The scaler starts afresh: an agent of it registered, or the operator changed it."""
    runtime.failures, runtime.next_attempt_at, runtime.failing = 0, 0.0, False


def backoff_note(runtime: ScalerRuntime) -> str:
    """The note on a job its scaler does not serve while in backoff."""
    until = datetime.fromtimestamp(runtime.next_attempt_at, UTC).isoformat(timespec="seconds")
    failures = runtime.failures
    return (
        f"waiting: scaler {runtime.entry.name} in provision backoff until {until} "
        f"({failures} failure{'s' if failures != 1 else ''}): {runtime.last_error}"
    )
