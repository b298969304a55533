"""Trigger declarations: which events start a workflow (docs/design/authoring.md §2.6)."""

from __future__ import annotations

import builtins
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from conveyor.sdk.durations import DurationLike, duration_ms
from conveyor.sdk.errors import authoring_error
from conveyor.sdk.patterns import PatternsLike, PatternSpec, filter_patterns

PR_ACTIONS = (
    "opened",
    "synchronize",
    "reopened",
    "closed",
    "edited",
    "ready_for_review",
    "converted_to_draft",
    "labeled",
    "unlabeled",
)
WORKFLOW_TERMINAL_STATUSES = ("success", "failed", "cancelled")
JOB_TERMINAL_STATUSES = ("success", "failed", "cancelled", "skipped", "timed_out")

_EVENT_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,127}$")
_INPUT_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
_PAYLOAD_PATH_RE = re.compile(r"^[A-Za-z0-9_-]+(\[\d+\])*(\.[A-Za-z0-9_-]+(\[\d+\])*)*$")
_SOURCE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")

ConditionValue = str | int | float | bool | None | list[Any] | re.Pattern[str]


@dataclass(frozen=True, slots=True)
class Condition:
    """A `match`/`not` condition on one payload path: equals, in (any of) or regex (full match)."""

    kind: Literal["equals", "in", "regex"]
    value: Any
    flags: str = ""


@dataclass(frozen=True, slots=True)
class PushTrigger:
    """`push(...)`: branch pushes, and tag pushes when `tags` is given."""

    branches: tuple[PatternSpec, ...]
    tags: tuple[PatternSpec, ...] | None
    paths: tuple[PatternSpec, ...]
    emits_push: bool


@dataclass(frozen=True, slots=True)
class TagTrigger:
    """`tag(...)`: tag pushes (creations and updates)."""

    patterns: tuple[PatternSpec, ...]


@dataclass(frozen=True, slots=True)
class PrTrigger:
    """`pr(...)`: pull-request activity."""

    events: tuple[str, ...]
    target: tuple[PatternSpec, ...]
    source: tuple[PatternSpec, ...]
    paths: tuple[PatternSpec, ...]


@dataclass(frozen=True, slots=True)
class Input:
    """A typed dispatch input; `choices=[...]` makes it a choice."""

    type: builtins.type = str
    required: bool = False
    default: Any = None
    choices: tuple[Any, ...] | None = None
    min: float | None = None
    max: float | None = None
    pattern: str | None = None
    description: str | None = None

    def __init__(
        self,
        type: builtins.type = str,
        *,
        required: bool = False,
        default: Any = None,
        choices: Iterable[Any] | None = None,
        min: float | None = None,
        max: float | None = None,
        pattern: str | None = None,
        description: str | None = None,
    ) -> None:
        object.__setattr__(self, "type", type)
        object.__setattr__(self, "required", required)
        object.__setattr__(self, "default", default)
        object.__setattr__(self, "choices", None if choices is None else tuple(choices))
        object.__setattr__(self, "min", min)
        object.__setattr__(self, "max", max)
        object.__setattr__(self, "pattern", pattern)
        object.__setattr__(self, "description", description)
        _check_input(self)


_INPUT_TYPE_NAMES: dict[type, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}


def input_type_name(spec: Input) -> str:
    """The lock's name for an input's type (`choice` when it has choices)."""
    return "choice" if spec.choices is not None else _INPUT_TYPE_NAMES[spec.type]


def _fits(value: Any, kind: type) -> bool:
    if kind is bool:
        return isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(value, str)


def _check_input(spec: Input) -> None:
    if spec.type not in _INPUT_TYPE_NAMES:
        raise authoring_error("E116", f"input type must be one of str, int, float, bool, not {spec.type!r}")
    if spec.choices is not None:
        if not spec.choices:
            raise authoring_error("E116", "input choices must not be empty")
        if not all(_fits(choice, spec.type) for choice in spec.choices):
            raise authoring_error("E116", f"input choices must all be {spec.type.__name__}")
    if (spec.min is not None or spec.max is not None) and spec.type not in (int, float):
        raise authoring_error("E116", "min/max apply only to int and float inputs")
    if spec.min is not None and spec.max is not None and spec.min > spec.max:
        raise authoring_error("E116", "input min is greater than max")
    if spec.pattern is not None:
        if spec.type is not str:
            raise authoring_error("E116", "pattern applies only to str inputs")
        try:
            re.compile(spec.pattern)
        except re.error as error:
            raise authoring_error("E116", f"input pattern does not compile: {error}") from None
    if spec.default is not None:
        if not _fits(spec.default, spec.type):
            raise authoring_error("E116", f"input default {spec.default!r} is not a {spec.type.__name__}")
        if spec.choices is not None and spec.default not in spec.choices:
            raise authoring_error("E116", f"input default {spec.default!r} is not one of the choices")


@dataclass(frozen=True, slots=True)
class DispatchTrigger:
    """`dispatch(...)`: manual or API-started runs with typed inputs."""

    types: tuple[str, ...]
    inputs: Mapping[str, Input]


@dataclass(frozen=True, slots=True)
class ScheduleTrigger:
    """`schedule(cron, timezone)`: cron fires, checked with croniter and zoneinfo."""

    cron: str
    timezone: str
    inputs: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class EventTrigger:
    """`event(name, ...)`: a custom event emitted with `ctx.emit` (or a `conveyor.*` system event)."""

    name: str
    match: Mapping[str, Condition]
    not_: Mapping[str, Condition]
    from_repos: tuple[PatternSpec, ...] | None


@dataclass(frozen=True, slots=True)
class WorkflowCompleteTrigger:
    """`workflow_complete(...)`: another workflow's run ended."""

    workflow: tuple[PatternSpec, ...]
    status: tuple[str, ...]
    from_repos: tuple[PatternSpec, ...] | None


@dataclass(frozen=True, slots=True)
class JobCompleteTrigger:
    """`job_complete(...)`: a job of another workflow ended."""

    workflow: tuple[PatternSpec, ...]
    job: tuple[PatternSpec, ...]
    status: tuple[str, ...]
    from_repos: tuple[PatternSpec, ...] | None


@dataclass(frozen=True, slots=True)
class WorkflowsFailedBatchTrigger:
    """`workflows_failed_batch(...)`: failed runs buffered for `window`, then one batch event."""

    window_ms: int
    workflow: tuple[PatternSpec, ...]
    from_repos: tuple[PatternSpec, ...] | None


@dataclass(frozen=True, slots=True)
class GenericWebhookTrigger:
    """`generic_webhook(source, ...)`: a non-git webhook delivered through a configured source."""

    source: str
    events: tuple[PatternSpec, ...]
    match: Mapping[str, Condition]
    not_: Mapping[str, Condition]


Trigger = (
    PushTrigger
    | TagTrigger
    | PrTrigger
    | DispatchTrigger
    | ScheduleTrigger
    | EventTrigger
    | WorkflowCompleteTrigger
    | JobCompleteTrigger
    | WorkflowsFailedBatchTrigger
    | GenericWebhookTrigger
)
TRIGGER_CLASSES = Trigger.__args__


def push(
    branches: PatternsLike | None = None, tags: PatternsLike | None = None, paths: PatternsLike | None = None
) -> PushTrigger:
    """Match pushes to `branches` (all when omitted); `tags` also matches tag pushes."""
    if tags is not None and branches is None and paths is not None:
        raise authoring_error(
            "E114", "push(): paths cannot be combined with tags alone (tag pushes have no diff)"
        )
    return PushTrigger(
        branches=filter_patterns(branches, what="push(branches=)"),
        tags=None if tags is None else filter_patterns(tags, what="push(tags=)"),
        paths=filter_patterns(paths, what="push(paths=)", globs_only=True),
        emits_push=not (tags is not None and branches is None),
    )


def tag(patterns: PatternsLike | None = None) -> TagTrigger:
    """Match tag pushes whose tag matches `patterns` (all tags when omitted)."""
    return TagTrigger(patterns=filter_patterns(patterns, what="tag(patterns=)"))


def pr(
    events: Iterable[str] | str = ("opened", "synchronize", "reopened"),
    target: PatternsLike | None = None,
    source: PatternsLike | None = None,
    paths: PatternsLike | None = None,
) -> PrTrigger:
    """Match pull-request `events` into `target` branches from `source` branches touching `paths`."""
    actions = (events,) if isinstance(events, str) else tuple(events)
    unknown = [action for action in actions if action not in PR_ACTIONS]
    if unknown:
        raise authoring_error(
            "E114", f"pr(events=): unknown action(s) {unknown}; valid: {', '.join(PR_ACTIONS)}"
        )
    return PrTrigger(
        events=actions,
        target=filter_patterns(target, what="pr(target=)"),
        source=filter_patterns(source, what="pr(source=)"),
        paths=filter_patterns(paths, what="pr(paths=)", globs_only=True),
    )


def dispatch(
    types: Iterable[str] | str | None = None, inputs: Mapping[str, Input] | None = None
) -> DispatchTrigger:
    """Match manual/API dispatches of `types` (all when omitted), validating `inputs` where the run is created."""
    kinds = () if types is None else ((types,) if isinstance(types, str) else tuple(types))
    for kind in kinds:
        if not _SOURCE_NAME_RE.match(kind):
            raise authoring_error("E114", f"dispatch(types=): invalid type {kind!r}")
    specs = dict(inputs or {})
    for name, spec in specs.items():
        if not isinstance(name, str) or not _INPUT_NAME_RE.match(name):
            raise authoring_error("E116", f"dispatch(inputs=): invalid input name {name!r}")
        if not isinstance(spec, Input):
            raise authoring_error("E116", f"dispatch(inputs=): {name!r} must be an Input(...)")
    return DispatchTrigger(types=kinds, inputs=specs)


def schedule(cron: str, timezone: str = "UTC", inputs: Mapping[str, Any] | None = None) -> ScheduleTrigger:
    """Match cron fires of this workflow's schedule (5-field cron, IANA timezone)."""
    from croniter import croniter  # imported here so `import conveyor` stays cheap

    if not isinstance(cron, str) or len(cron.split()) != 5 or not croniter.is_valid(cron):
        raise authoring_error("E111", f"schedule(): {cron!r} is not a valid 5-field cron expression")
    try:
        from zoneinfo import ZoneInfo

        ZoneInfo(timezone)
    except Exception:
        raise authoring_error("E111", f"schedule(): unknown timezone {timezone!r}") from None
    return ScheduleTrigger(cron=" ".join(cron.split()), timezone=timezone, inputs=dict(inputs or {}))


def conditions(spec: Mapping[str, ConditionValue] | None, *, what: str) -> dict[str, Condition]:
    """Validate a `match`/`not` mapping of payload paths to conditions."""
    result: dict[str, Condition] = {}
    for path, value in (spec or {}).items():
        if not isinstance(path, str) or not _PAYLOAD_PATH_RE.match(path):
            raise authoring_error("E114", f"{what}: invalid payload path {path!r} (use dot keys and [n])")
        if isinstance(value, re.Pattern):
            (pattern_spec,) = filter_patterns(value, what=what)
            result[path] = Condition("regex", pattern_spec.pattern, pattern_spec.flags)
        elif isinstance(value, list | tuple):
            result[path] = Condition("in", list(value))
        elif value is None or isinstance(value, str | int | float | bool):
            result[path] = Condition("equals", value)
        else:
            raise authoring_error(
                "E114", f"{what}: condition on {path!r} must be a scalar, a list or a re.Pattern"
            )
    return result


def _from_repos(value: PatternsLike | None, what: str) -> tuple[PatternSpec, ...] | None:
    return None if value is None else filter_patterns(value, what=what)


def event(
    name: str,
    match: Mapping[str, ConditionValue] | None = None,
    not_: Mapping[str, ConditionValue] | None = None,
    from_repos: PatternsLike | None = None,
) -> EventTrigger:
    """Match the custom event `name` whose payload satisfies `match` and none of `not_`."""
    if not isinstance(name, str) or not _EVENT_NAME_RE.match(name) or name.startswith("__"):
        raise authoring_error("E114", f"event(): invalid event name {name!r}")
    return EventTrigger(
        name=name,
        match=conditions(match, what="event(match=)"),
        not_=conditions(not_, what="event(not_=)"),
        from_repos=_from_repos(from_repos, "event(from_repos=)"),
    )


def _statuses(value: Iterable[str] | str | None, allowed: tuple[str, ...], what: str) -> tuple[str, ...]:
    statuses = () if value is None else ((value,) if isinstance(value, str) else tuple(value))
    unknown = [status for status in statuses if status not in allowed]
    if unknown:
        raise authoring_error("E114", f"{what}: unknown status(es) {unknown}; valid: {', '.join(allowed)}")
    return statuses


def workflow_complete(
    workflow: PatternsLike | None = None,
    status: Iterable[str] | str | None = None,
    from_repos: PatternsLike | None = None,
) -> WorkflowCompleteTrigger:
    """Match the end of runs of `workflow` (patterns) with one of `status`."""
    return WorkflowCompleteTrigger(
        workflow=filter_patterns(workflow, what="workflow_complete(workflow=)"),
        status=_statuses(status, WORKFLOW_TERMINAL_STATUSES, "workflow_complete(status=)"),
        from_repos=_from_repos(from_repos, "workflow_complete(from_repos=)"),
    )


def job_complete(
    workflow: PatternsLike | None = None,
    job: PatternsLike | None = None,
    status: Iterable[str] | str | None = None,
    from_repos: PatternsLike | None = None,
) -> JobCompleteTrigger:
    """Match the end of jobs named `job` in workflows `workflow` with one of `status`."""
    return JobCompleteTrigger(
        workflow=filter_patterns(workflow, what="job_complete(workflow=)"),
        job=filter_patterns(job, what="job_complete(job=)"),
        status=_statuses(status, JOB_TERMINAL_STATUSES, "job_complete(status=)"),
        from_repos=_from_repos(from_repos, "job_complete(from_repos=)"),
    )


def workflows_failed_batch(
    window: DurationLike = "5m", workflow: PatternsLike | None = None, from_repos: PatternsLike | None = None
) -> WorkflowsFailedBatchTrigger:
    """Buffer failed runs of `workflow` for `window`, then start one run for the whole batch."""
    return WorkflowsFailedBatchTrigger(
        window_ms=duration_ms(window, what="workflows_failed_batch(window=)"),
        workflow=filter_patterns(workflow, what="workflows_failed_batch(workflow=)"),
        from_repos=_from_repos(from_repos, "workflows_failed_batch(from_repos=)"),
    )


def generic_webhook(
    source: str,
    events: PatternsLike | None = None,
    match: Mapping[str, ConditionValue] | None = None,
    not_: Mapping[str, ConditionValue] | None = None,
) -> GenericWebhookTrigger:
    """Match webhooks from the configured generic source `source` mapped to one of `events`."""
    if not isinstance(source, str) or not _SOURCE_NAME_RE.match(source):
        raise authoring_error("E114", f"generic_webhook(): invalid source name {source!r}")
    return GenericWebhookTrigger(
        source=source,
        events=filter_patterns(events, what="generic_webhook(events=)"),
        match=conditions(match, what="generic_webhook(match=)"),
        not_=conditions(not_, what="generic_webhook(not_=)"),
    )


def as_triggers(on: object) -> tuple[Trigger, ...]:
    """Normalise `workflow(on=...)`: one trigger or a list of them."""
    items = [on] if isinstance(on, TRIGGER_CLASSES) else list(on)  # type: ignore[call-overload]
    for item in items:
        if not isinstance(item, TRIGGER_CLASSES):
            raise authoring_error(
                "E114", f"on=: {item!r} is not a trigger (use push(), pr(), schedule(), ...)"
            )
    return tuple(items)


__all__ = [
    "Condition",
    "DispatchTrigger",
    "EventTrigger",
    "GenericWebhookTrigger",
    "Input",
    "JobCompleteTrigger",
    "PrTrigger",
    "PushTrigger",
    "ScheduleTrigger",
    "TagTrigger",
    "Trigger",
    "WorkflowCompleteTrigger",
    "WorkflowsFailedBatchTrigger",
    "dispatch",
    "event",
    "generic_webhook",
    "job_complete",
    "pr",
    "push",
    "schedule",
    "tag",
    "workflow_complete",
    "workflows_failed_batch",
]
