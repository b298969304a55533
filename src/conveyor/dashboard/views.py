"""Pure helpers of the dashboard's pages: ordering, durations, which step to open, safe redirects."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

TERMINAL_RUN_STATUSES = ("success", "failed", "cancelled")


def jobs_in_needs_order(jobs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Jobs so that each comes after every job it `needs`, otherwise in the order given.

    Matrix jobs share a name and stay together; a need on a name that is not in the run (or a cycle,
    which the compiler refuses) does not hide a job: what cannot be placed goes last, in order.
    """
    names = {job["name"] for job in jobs}
    placed: list[dict[str, Any]] = []
    done_names: set[str] = set()
    remaining = list(jobs)
    while remaining:
        ready = [
            job
            for job in remaining
            if all(need in done_names or need not in names for need in job.get("needs") or [])
        ]
        if not ready:
            placed.extend(remaining)
            break
        placed.extend(ready)
        remaining = [job for job in remaining if job not in ready]
        done_names |= {job["name"] for job in ready}
        # A name is done only when none of its matrix siblings is still waiting.
        done_names -= {job["name"] for job in remaining}
    return placed


def open_step_index(job: dict[str, Any]) -> int | None:
    """The step a job's log opens at: the first failed step, else the running one, else the last."""
    steps = job.get("steps") or []
    for status in ("failed", "running"):
        for step in steps:
            if step.get("status") == status:
                return int(step["step_index"])
    started = [step for step in steps if step.get("status") not in (None, "pending", "skipped")]
    if started:
        return int(started[-1]["step_index"])
    return int(steps[-1]["step_index"]) if steps else None


def _parse(value: Any) -> datetime | None:
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
    begin, end = _parse(started), _parse(finished)
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


def safe_next(target: str | None) -> str:
    """Where to go after signing in: a path under /ui only, never another site."""
    if not target or not target.startswith("/ui") or target.startswith("//") or "\\" in target:
        return "/ui/runs"
    if target.startswith("/ui/sign-in"):
        return "/ui/runs"
    return target
