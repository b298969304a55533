"""Pure helpers of the dashboard's pages: ordering, durations and times, which step to open, which rows a
list hides, safe redirects."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from conveyor.model.durations import parse_time

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


def relative_time(value: Any, now: datetime) -> str:
    """`just now`, `42 s ago`, `5 min ago`, `3 h ago`, `2 d ago` (`in 5 min` ahead); empty without a time."""
    moment = parse_time(value)
    if moment is None:
        return ""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    seconds = int((now - moment).total_seconds())
    ahead, seconds = seconds < 0, abs(seconds)
    if seconds < 5:
        return "just now"
    for size, unit in ((86_400, "d"), (3_600, "h"), (60, "min"), (1, "s")):
        if seconds >= size:
            amount = f"{seconds // size} {unit}"
            return f"in {amount}" if ahead else f"{amount} ago"
    return "just now"  # unreachable: seconds >= 5 matched a unit


def exact_time(value: Any) -> str:
    """`2026-12-07 10:19:52.123 UTC`: the hover text of a relative time; empty without a time."""
    moment = parse_time(value)
    if moment is None:
        return ""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


def visible_agents(
    agents: Sequence[dict[str, Any]], now: datetime, gone_ms: int, *, show_gone: bool
) -> tuple[list[dict[str, Any]], int]:
    """The agents list without ephemeral agents offline for more than `gone_ms` (each scaled job leaves
    one behind), and how many were hidden. A static agent stays: it is expected back."""
    if show_gone:
        return list(agents), 0
    shown = []
    for agent in agents:
        since = parse_time(agent.get("disconnected_at") or agent.get("last_seen_at"))
        if since is not None and since.tzinfo is None:
            since = since.replace(tzinfo=UTC)
        gone = (
            agent.get("ephemeral")
            and agent.get("state") == "offline"
            and since is not None
            and (now - since).total_seconds() * 1000 > gone_ms
        )
        if not gone:
            shown.append(agent)
    return shown, len(agents) - len(shown)


def can_rerun_failed(run_status: str) -> bool:
    """ "Re-run failed jobs" is offered on a failed run only (elsewhere there is nothing failed to re-run)."""
    return run_status == "failed"


def safe_next(target: str | None) -> str:
    """Where to go after signing in: a path under /ui only, never another site."""
    if not target or not target.startswith("/ui") or target.startswith("//") or "\\" in target:
        return "/ui/runs"
    if target.startswith("/ui/sign-in"):
        return "/ui/runs"
    return target
