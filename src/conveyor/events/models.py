"""Names, outcomes, settings and errors of the internal event system (docs/design/events.md §1, §2, §3.3)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from conveyor.errors import ConveyorError

Origin = Literal["custom", "admin", "system"]
Outcome = Literal[
    "matched",
    "buffered",
    "trust-blocked",
    "no-trigger-match",
    "no-target-repo",
    "no-registration",
    "delivered",
]
OUTCOMES: tuple[str, ...] = Outcome.__args__  # type: ignore[attr-defined]
ProcessingState = Literal["dlq", "processed", "leased", "retrying", "pending"]
STATES: tuple[str, ...] = ProcessingState.__args__  # type: ignore[attr-defined]

WORKFLOW_COMPLETE = "__workflow_complete"
JOB_COMPLETE = "__job_complete"
SCHEDULE_FIRE = "__schedule_fire"
FAILED_BATCH = "__workflows_failed_batch"
GENERIC_WEBHOOK = "__generic_webhook"
REGISTRATION_UPDATED = "conveyor.registration.updated"
SCALE_UP = "conveyor.scaler.scale_up"
SCALE_DOWN = "conveyor.scaler.scale_down"
NOTIFICATION = "conveyor.notification"
APPROVAL_REQUESTED = "conveyor.approval.requested"

# The trigger kind each reserved name reaches; every other name reaches `event` triggers.
RESERVED_KINDS: dict[str, str] = {
    WORKFLOW_COMPLETE: "workflow_complete",
    JOB_COMPLETE: "job_complete",
    SCHEDULE_FIRE: "schedule",
    FAILED_BATCH: "workflows_failed_batch",
    GENERIC_WEBHOOK: "generic_webhook",
}
# Trigger kinds that make a workflow a registration (docs/design/events.md §5).
REGISTERED_KINDS = frozenset(
    {"event", "workflow_complete", "job_complete", "workflows_failed_batch", "generic_webhook", "schedule"}
)
# The fields every reserved payload must carry (docs/design/events.md §1); a row without them can never be
# routed.
RESERVED_FIELDS: dict[str, tuple[str, ...]] = {
    WORKFLOW_COMPLETE: ("run_id", "workflow_name", "repo", "status"),
    JOB_COMPLETE: ("run_id", "job_id", "workflow_name", "job_name", "repo", "status"),
    SCHEDULE_FIRE: ("registration_id", "workflow_name", "repo", "cron", "timezone", "slot_at"),
    FAILED_BATCH: ("registration_id", "total", "runs"),
    GENERIC_WEBHOOK: ("source", "body"),
    REGISTRATION_UPDATED: ("routing_key", "repo", "mode"),
    SCALE_UP: ("request_id",),
    SCALE_DOWN: ("request_id",),
    NOTIFICATION: ("rule_id", "event", "run_id"),
    # `environment` is null for a job held only by its run (a fork's pull request).
    APPROVAL_REQUESTED: ("run_id", "job_id"),
}
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,127}$")
MAX_TARGET_REPOS = 50
MAX_ERROR_CHARS = 4096


def is_reserved(name: str) -> bool:
    """Names only the orchestrator writes: `__*` and `conveyor.*`."""
    return name.startswith("__") or name.startswith("conveyor.")


def reserved_payload_problem(name: str, payload: Mapping[str, Any]) -> str | None:
    """Why a reserved event's payload does not fit its model (None when it does, or for custom names)."""
    missing = [key for key in RESERVED_FIELDS.get(name, ()) if payload.get(key) is None]
    if missing:
        return f"{name} payload lacks {', '.join(missing)}"
    if name == GENERIC_WEBHOOK and not isinstance(payload.get("body"), dict):
        return f"{name} payload body is not an object"
    return None


def kind_of(name: str) -> str:
    """The trigger kind an event name reaches (docs/design/events.md §1)."""
    return RESERVED_KINDS.get(name, "event")


def metric_name(name: str) -> str:
    """The `event` label: the reserved name, or `custom` (bounded cardinality)."""
    return name if is_reserved(name) else "custom"


def truncate_error(text: str) -> str:
    """`last_error` is at most 4096 characters, then `…[truncated]`."""
    return text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS] + "…[truncated]"


class EmitRejected(ConveyorError):
    """An emit refused before insert; `code` is the API error code."""

    def __init__(self, code: str, detail: str, retry_after_ms: int | None = None, status: int = 400) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail
        self.retry_after_ms = retry_after_ms
        self.status = status


class NonRetryableEventError(ConveyorError):
    """Processing can never succeed: the event goes to the DLQ at once (`non_retryable`)."""


class LeaseLostError(ConveyorError):
    """`finish` matched no row: another node took the event over; the dispatch rolls back."""


@dataclass(frozen=True)
class EmitRequest:
    """One event to insert (docs/design/events.md §2.2)."""

    name: str
    origin: Origin
    org_id: str | None
    payload: Mapping[str, Any] = field(default_factory=dict)
    source_routing_key: str | None = None
    source_repo: str | None = None
    source_run_id: str | None = None
    source_job_id: str | None = None
    target_repos: list[str] | None = None
    chain_depth: int = 0
    dedup_key: str | None = None


@dataclass(frozen=True)
class EmitResult:
    """The event id, and whether this call inserted it (False for a dedup replay)."""

    event_id: str
    created: bool


@dataclass(frozen=True)
class EventSettings:
    """The event system's settings: the server's `events_*` and `cron_tick_seconds` settings and the four
    live cluster knobs (built by `conveyor.events.startup.event_settings`; the defaults are docs/events.md's)."""

    lease_seconds: float = 60.0
    retry_base_seconds: float = 5.0
    retry_max_seconds: float = 300.0
    poll_seconds: float = 5.0
    scan_seconds: float = 10.0
    cleanup_seconds: float = 3600.0
    concurrency: int = 8
    max_chain_depth: int = 10
    batch_max_runs: int = 100
    cron_tick_seconds: float = 15.0
    max_attempts: int = 5
    ttl_seconds: int = 604_800
    rate_limit_per_minute: int = 100
    max_payload_bytes: int = 65_536
    # Notifications (docs/design/events.md §10): the dashboard's address for run links, and the SMTP
    # server and sender of email.
    public_url: str | None = None
    smtp_url: str | None = None
    smtp_from: str | None = None
    # Seconds a webhook POST or an SMTP conversation may take before the attempt counts as failed.
    notify_timeout_seconds: float = 20.0
    test_fail_first_n: dict[str, int] = field(default_factory=dict)
    # Test hook: names whose dispatch stops before `finish` (inside the transaction), to kill the node there.
    test_stall_names: frozenset[str] = frozenset()
