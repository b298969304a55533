"""The state machine of runs, jobs and steps (docs/design/execution.md §4) as pure data and functions.

Stores apply a transition with a guarded UPDATE whose `WHERE status IN (...)` comes from
`allowed_sources`, so two writers racing on one row cannot both win and an illegal transition
never reaches the database.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Literal, NamedTuple

from conveyor.errors import ConveyorError

Entity = Literal["run", "job", "step"]

RUN_STATUSES = ("pending", "queued", "running", "cancelling", "success", "failed", "cancelled")
JOB_STATUSES = (
    "pending",
    "waiting_approval",
    "queued",
    "dispatched",
    "running",
    "recovering",
    "cancelling",
    "success",
    "failed",
    "cancelled",
    "skipped",
    "timed_out",
)
STEP_STATUSES = ("running", "success", "failed", "cancelled", "skipped", "timed_out")

RUN_TERMINAL = frozenset({"success", "failed", "cancelled"})
JOB_TERMINAL = frozenset({"success", "failed", "cancelled", "skipped", "timed_out"})
STEP_TERMINAL = JOB_TERMINAL
# Jobs holding an agent slot or a job concurrency group.
JOB_ACTIVE = frozenset({"dispatched", "running", "recovering", "cancelling"})

# None is row creation.
_RUN: dict[str | None, frozenset[str]] = {
    None: frozenset({"queued", "pending", "failed"}),
    "pending": frozenset({"queued", "cancelled", "failed"}),
    "queued": frozenset({"running", "cancelling"}) | RUN_TERMINAL,
    "running": frozenset({"cancelling"}) | RUN_TERMINAL,
    "cancelling": RUN_TERMINAL,
}
_JOB: dict[str | None, frozenset[str]] = {
    # `success` at creation: a failed-only re-run copies the parent's successful jobs.
    None: frozenset({"pending", "queued", "waiting_approval", "failed", "success"}),
    "pending": frozenset({"queued", "waiting_approval", "skipped", "cancelled", "timed_out", "failed"}),
    # docs/design/approvals.md §2: approved (queued, or pending on a group), rejected, cancelled.
    "waiting_approval": frozenset({"queued", "pending", "failed", "cancelled"}),
    # `running`: a fan-out job whose host executions were queued (docs/design/execution.md §13).
    "queued": frozenset({"dispatched", "running", "cancelled", "timed_out", "failed"}),
    "dispatched": frozenset({"running", "queued", "cancelling"}) | JOB_TERMINAL,
    "running": frozenset({"recovering", "cancelling"}) | JOB_TERMINAL,
    "recovering": frozenset({"running"}) | JOB_TERMINAL,
    "cancelling": JOB_TERMINAL,
}
_STEP: dict[str | None, frozenset[str]] = {
    None: frozenset({"running"}) | STEP_TERMINAL,
    "running": frozenset({"success", "failed", "timed_out", "cancelled"}),
}
TRANSITIONS: dict[Entity, dict[str | None, frozenset[str]]] = {"run": _RUN, "job": _JOB, "step": _STEP}
STATUSES: dict[Entity, tuple[str, ...]] = {"run": RUN_STATUSES, "job": JOB_STATUSES, "step": STEP_STATUSES}
TERMINAL: dict[Entity, frozenset[str]] = {"run": RUN_TERMINAL, "job": JOB_TERMINAL, "step": STEP_TERMINAL}


class InvalidTransition(ConveyorError):
    """A status change the state machine does not allow."""

    def __init__(self, entity: Entity, src: str | None, dst: str) -> None:
        super().__init__(f"{entity} cannot go from {src or 'creation'} to {dst}")
        self.entity, self.src, self.dst = entity, src, dst


def is_allowed(entity: Entity, src: str | None, dst: str) -> bool:
    """Whether `src → dst` is a legal transition (`src` None = creating the row)."""
    return dst in TRANSITIONS[entity].get(src, frozenset())


def check(entity: Entity, src: str | None, dst: str) -> None:
    """Raise `InvalidTransition` unless `src → dst` is legal."""
    if not is_allowed(entity, src, dst):
        raise InvalidTransition(entity, src, dst)


def allowed_sources(entity: Entity, dst: str) -> frozenset[str]:
    """Existing statuses from which `dst` may be reached (for a guarded UPDATE's `WHERE status IN`)."""
    return frozenset(
        src for src, targets in TRANSITIONS[entity].items() if src is not None and dst in targets
    )


def is_terminal(entity: Entity, status: str) -> bool:
    """Whether nothing can follow `status`."""
    return status in TERMINAL[entity]


def aggregate_status(statuses: Iterable[str]) -> str | None:
    """One upstream's aggregate over its matrix combinations (docs/design/authoring.md §2.2,
    docs/design/execution.md §8.1).

    None while any combination is unfinished; else the first of failed, timed_out, cancelled that
    any has, else success if one succeeded, else skipped.
    """
    values = list(statuses)
    if not values or any(s not in JOB_TERMINAL for s in values):
        return None
    for status in ("failed", "timed_out", "cancelled"):
        if status in values:
            return status
    return "success" if "success" in values else "skipped"


HOOKS_JOB = "__hooks__"


def run_conclusion(
    jobs: Iterable[tuple[str, str]],
    *,
    cancel_requested: bool,
    workflow_timed_out: bool,
    hooks_on_success_failed: bool = False,
) -> str:
    """The run's terminal status once every job is terminal (docs/design/execution.md §4 "Run conclusion").

    `jobs` are (name, status) pairs; the workflow-hooks job does not count, except that a failing
    `on_success` hook makes the run fail.
    """
    counted = [status for name, status in jobs if name != HOOKS_JOB]
    if cancel_requested and not workflow_timed_out:
        return "cancelled"
    if workflow_timed_out:
        return "failed"
    if any(s in ("failed", "timed_out") for s in counted) or hooks_on_success_failed:
        return "failed"
    if "cancelled" in counted:
        return "cancelled"
    return "success"


class JobEnd(NamedTuple):
    """A job as `ended_because` reads it."""

    display_name: str
    status: str
    reason: str | None
    finished_at: datetime | None


def ended_because(run_status: str, run_reason: str | None, jobs: Iterable[JobEnd]) -> str | None:
    """Why a failed or cancelled run ended, in one line (`run list`, `run logs --follow`); else None.

    The run's own reason when it has one (a workflow timeout, a concurrency wait); else `<job>: <reason>`
    of the job that ended it: the first to fail or time out (a fail-fast cancels its siblings after it),
    else the first cancelled.
    """
    if run_status not in ("failed", "cancelled"):
        return None
    if run_reason:
        return run_reason
    ended = list(jobs)
    for wanted in (("failed", "timed_out"), ("cancelled",)):
        first = min(
            (job for job in ended if job.status in wanted),
            key=lambda job: (job.finished_at is None, job.finished_at or datetime.min),
            default=None,
        )
        if first is not None:
            return f"{first.display_name}: {first.reason or first.status}"
    return None
