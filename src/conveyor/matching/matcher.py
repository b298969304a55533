"""Pure trigger matching with a complete trace (docs/design/authoring.md §5): compiled triggers and the
reference matcher.

Triggers are compiled once per lock (patterns precompiled, per-type verdicts shared) because the router
evaluates the same locks for every event, at tens of thousands of registrations. `matching.index` builds
the indexed `match_workflows` the orchestrator uses on top of these compiled workflows.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from typing import Any

from conveyor.lockfile.models import (
    DispatchTriggerEntry,
    EventTriggerEntry,
    GenericWebhookTriggerEntry,
    JobCompleteTriggerEntry,
    Lock,
    PatternEntry,
    PrTriggerEntry,
    PushTriggerEntry,
    ScheduleTriggerEntry,
    TagTriggerEntry,
    TriggerEntry,
    WorkflowCompleteTriggerEntry,
    WorkflowEntry,
    WorkflowsFailedBatchTriggerEntry,
)
from conveyor.matching.conditions import Condition, condition_holds, describe_condition, payload_value
from conveyor.matching.event import Event, event_summary
from conveyor.matching.patterns import CompiledPatterns
from conveyor.matching.trace import Check, Decision, TriggerDecision, WorkflowDecision

# (event, workflow name, subscriber repo) -> checks of a trigger whose type equals the event's.
TriggerChecks = Callable[[Event, str, str | None], list[Check]]

_DELETED = Check("action", False, "push and tag triggers never match a deleted ref")


@lru_cache(maxsize=4096)
def type_mismatch(index: int, trigger_type: str, event_type: str) -> TriggerDecision:
    # Most triggers fail on type; sharing these immutable verdicts keeps large locks cheap to match.
    return TriggerDecision(index, trigger_type, False, (Check("type", False, f"event type is {event_type}"),))


def _pattern_check(name: str, entries: Sequence[PatternEntry]) -> Callable[[str | None], Check]:
    compiled = CompiledPatterns(entries)

    def check(value: str | None) -> Check:
        return Check(name, *compiled.verdict(value))

    return check


def _paths_check(entries: Sequence[PatternEntry]) -> Callable[[Sequence[str] | None], Check]:
    compiled = CompiledPatterns(entries)

    def check(files: Sequence[str] | None) -> Check:
        return Check("paths", *compiled.paths_verdict(files))

    return check


def _member(name: str, allowed: Sequence[str], value: str | None, what: str) -> Check:
    if value in allowed:
        return Check(name, True, f"{what} '{value}' is one of {list(allowed)}")
    return Check(name, False, f"{what} {value!r} is not one of {list(allowed)}")


def _conditions(
    name: str, conditions: Mapping[str, Condition], payload: Mapping[str, Any], *, negate: bool
) -> Check:
    for path, condition in conditions.items():
        holds = condition_holds(condition, payload, path)
        if negate and holds:
            return Check(name, False, f"payload.{path} {describe_condition(condition)} holds")
        if not negate and not holds:
            return Check(name, False, f"payload.{path} {describe_condition(condition)} does not hold")
    return Check(name, True, "no excluded condition holds" if negate else "every condition holds")


def _from_repos_check(entries: list[PatternEntry] | None) -> Callable[[Event, str | None], Check]:
    patterns = _pattern_check("from_repos", entries) if entries is not None else None

    def check(event: Event, subscriber_repo: str | None) -> Check:
        if patterns is not None:
            return patterns(event.repo)
        if not event.repo:
            return Check("from_repos", True, "org-wide operator event (no source repository)")
        if subscriber_repo is None or event.repo == subscriber_repo:
            return Check("from_repos", True, f"'{event.repo}' is this repository")
        return Check("from_repos", False, f"'{event.repo}' is another repository and from_repos is not set")

    return check


def _payload_str(payload: Mapping[str, Any], key: str) -> str | None:
    value = payload_value(payload, key)
    return value if isinstance(value, str) else None


def _compile_push(trigger: PushTriggerEntry) -> TriggerChecks:
    branches = _pattern_check("branches", trigger.branches) if trigger.branches else None
    push_paths = _paths_check(trigger.paths) if trigger.paths else None

    def push(event: Event, workflow: str, subscriber: str | None) -> list[Check]:
        if event.action == "deleted":
            return [_DELETED]
        checks = []
        if branches is not None:
            checks.append(branches(event.branch))
        if push_paths is not None:
            checks.append(push_paths(event.changed_files))
        return checks

    return push


def _compile_tag(trigger: TagTriggerEntry) -> TriggerChecks:
    patterns = _pattern_check("patterns", trigger.patterns) if trigger.patterns else None

    def tag(event: Event, workflow: str, subscriber: str | None) -> list[Check]:
        if event.action == "deleted":
            return [_DELETED]
        return [patterns(event.tag)] if patterns is not None else []

    return tag


def _compile_pr(trigger: PrTriggerEntry) -> TriggerChecks:
    events, target = trigger.events, _pattern_check("target", trigger.target) if trigger.target else None
    source = _pattern_check("source", trigger.source) if trigger.source else None
    pr_paths = _paths_check(trigger.paths) if trigger.paths else None

    def pr(event: Event, workflow: str, subscriber: str | None) -> list[Check]:
        checks = [_member("events", events, event.action, "action")] if events else []
        if target is not None:
            checks.append(target(event.base_branch))
        if source is not None:
            checks.append(source(event.head_branch))
        if pr_paths is not None:
            checks.append(pr_paths(event.changed_files))
        return checks

    return pr


def _compile_dispatch(trigger: DispatchTriggerEntry) -> TriggerChecks:
    types = trigger.types

    def dispatch(event: Event, workflow: str, subscriber: str | None) -> list[Check]:
        return [_member("types", types, event.action, "dispatch type")] if types else []

    return dispatch


def _compile_schedule(trigger: ScheduleTriggerEntry) -> TriggerChecks:
    cron, timezone = trigger.cron, trigger.timezone

    def schedule(event: Event, workflow: str, subscriber: str | None) -> list[Check]:
        fired_for = event.payload.get("workflow_name")
        fired_cron, fired_zone = event.payload.get("cron"), event.payload.get("timezone", "UTC")
        same = fired_cron is not None and " ".join(str(fired_cron).split()) == cron and fired_zone == timezone
        return [
            Check("workflow", fired_for == workflow, f"schedule fired for workflow {fired_for!r}"),
            Check("cron", same, f"fired '{fired_cron}' ({fired_zone}); trigger is '{cron}' ({timezone})"),
        ]

    return schedule


def _compile_event(trigger: EventTriggerEntry) -> TriggerChecks:
    name, match, exclude = trigger.name, trigger.match, trigger.not_
    from_repos = _from_repos_check(trigger.from_repos)

    def custom(event: Event, workflow: str, subscriber: str | None) -> list[Check]:
        ok = event.action == name
        checks = [Check("name", ok, f"event name {event.action!r} {'=' if ok else '!='} '{name}'")]
        if match:
            checks.append(_conditions("match", match, event.payload, negate=False))
        if exclude:
            checks.append(_conditions("not", exclude, event.payload, negate=True))
        checks.append(from_repos(event, subscriber))
        return checks

    return custom


def _compile_completion(trigger: WorkflowCompleteTriggerEntry | JobCompleteTriggerEntry) -> TriggerChecks:
    statuses = trigger.status
    workflows = _pattern_check("workflow", trigger.workflow) if trigger.workflow else None
    jobs = (
        _pattern_check("job", trigger.job)
        if isinstance(trigger, JobCompleteTriggerEntry) and trigger.job
        else None
    )
    completion_repos = _from_repos_check(trigger.from_repos)

    def completion(event: Event, workflow: str, subscriber: str | None) -> list[Check]:
        checks = [_member("status", statuses, event.action, "status")] if statuses else []
        if workflows is not None:
            checks.append(workflows(_payload_str(event.payload, "workflow_name")))
        if jobs is not None:
            checks.append(jobs(_payload_str(event.payload, "job_name")))
        checks.append(completion_repos(event, subscriber))
        return checks

    return completion


def _compile_generic_webhook(trigger: GenericWebhookTriggerEntry) -> TriggerChecks:
    source_name, names = trigger.source, _pattern_check("events", trigger.events) if trigger.events else None
    hook_match, hook_not = trigger.match, trigger.not_

    def webhook(event: Event, workflow: str, subscriber: str | None) -> list[Check]:
        ok = event.source == source_name
        checks = [Check("source", ok, f"source {event.source!r} {'=' if ok else '!='} '{source_name}'")]
        if names is not None:
            checks.append(names(event.action))
        if hook_match:
            checks.append(_conditions("match", hook_match, event.payload, negate=False))
        if hook_not:
            checks.append(_conditions("not", hook_not, event.payload, negate=True))
        return checks

    return webhook


def compile_trigger(trigger: TriggerEntry) -> TriggerChecks:
    """Precompile a trigger's filters; the result lists every present filter in lock field order."""
    match trigger:
        case PushTriggerEntry():
            return _compile_push(trigger)
        case TagTriggerEntry():
            return _compile_tag(trigger)
        case PrTriggerEntry():
            return _compile_pr(trigger)
        case DispatchTriggerEntry():
            return _compile_dispatch(trigger)
        case ScheduleTriggerEntry():
            return _compile_schedule(trigger)
        case EventTriggerEntry():
            return _compile_event(trigger)
        case WorkflowCompleteTriggerEntry() | JobCompleteTriggerEntry():
            return _compile_completion(trigger)
        case WorkflowsFailedBatchTriggerEntry():
            # The router hands a batch event only to its own registration, so the type is the whole test.
            return lambda event, workflow, subscriber: []
    assert isinstance(trigger, GenericWebhookTriggerEntry)
    return _compile_generic_webhook(trigger)


def _batch_buffering(
    index: int, trigger: WorkflowsFailedBatchTriggerEntry, event: Event, subscriber_repo: str | None
) -> TriggerDecision:
    """A failed `workflow_complete` is buffered into this trigger's window when its filters pass."""
    checks = [Check("status", event.action == "failed", f"run status is {event.action!r}")]
    if trigger.workflow:
        checks.append(
            _pattern_check("workflow", trigger.workflow)(_payload_str(event.payload, "workflow_name"))
        )
    checks.append(_from_repos_check(trigger.from_repos)(event, subscriber_repo))
    return TriggerDecision(
        index, trigger.type, False, tuple(checks), buffered=all(check.ok for check in checks)
    )


class CompiledWorkflow:
    """A workflow's triggers compiled, plus its shared all-types-mismatch decisions per event type."""

    __slots__ = ("checks", "has_batch", "mismatch", "name", "triggers", "types")

    def __init__(self, workflow: WorkflowEntry) -> None:
        self.name = workflow.name
        self.triggers = tuple(workflow.triggers)
        self.checks = tuple(compile_trigger(trigger) for trigger in self.triggers)
        self.types = frozenset(trigger.type for trigger in self.triggers)
        self.has_batch = "workflows_failed_batch" in self.types
        self.mismatch: dict[str, WorkflowDecision] = {}

    def decide(self, event: Event, subscriber_repo: str | None) -> WorkflowDecision:
        event_type = event.type
        if event_type not in self.types and not (self.has_batch and event_type == "workflow_complete"):
            cached = self.mismatch.get(event_type)
            if cached is None:
                decisions = tuple(
                    type_mismatch(index, trigger.type, event_type)
                    for index, trigger in enumerate(self.triggers)
                )
                cached = self.mismatch[event_type] = WorkflowDecision(self.name, False, None, decisions)
            return cached
        results = []
        first = None
        for index, trigger in enumerate(self.triggers):
            if trigger.type != event_type:
                if (
                    isinstance(trigger, WorkflowsFailedBatchTriggerEntry)
                    and event_type == "workflow_complete"
                ):
                    results.append(_batch_buffering(index, trigger, event, subscriber_repo))
                else:
                    results.append(type_mismatch(index, trigger.type, event_type))
                continue
            checks = self.checks[index](event, self.name, subscriber_repo)
            matched = all(check.ok for check in checks)
            if matched and first is None:
                first = index
            results.append(TriggerDecision(index, trigger.type, matched, tuple(checks)))
        return WorkflowDecision(self.name, first is not None, first, tuple(results))


_COMPILED_LOCKS: OrderedDict[int, tuple[Lock, tuple[CompiledWorkflow, ...]]] = OrderedDict()
_COMPILED_LOCKS_MAX = 256


def _compiled(lock: Lock) -> tuple[CompiledWorkflow, ...]:
    # Keyed by identity while holding the lock itself, so a recycled id can never alias another lock.
    key = id(lock)
    hit = _COMPILED_LOCKS.get(key)
    if hit is not None and hit[0] is lock:
        _COMPILED_LOCKS.move_to_end(key)
        return hit[1]
    compiled = tuple(CompiledWorkflow(workflow) for workflow in lock.workflows)
    _COMPILED_LOCKS[key] = (lock, compiled)
    if len(_COMPILED_LOCKS) > _COMPILED_LOCKS_MAX:
        _COMPILED_LOCKS.popitem(last=False)
    return compiled


def match_trigger(
    index: int, trigger: TriggerEntry, event: Event, *, workflow_name: str, subscriber_repo: str | None = None
) -> TriggerDecision:
    """Evaluate one trigger against an event (the event router calls this per registration trigger)."""
    if trigger.type != event.type:
        if isinstance(trigger, WorkflowsFailedBatchTriggerEntry) and event.type == "workflow_complete":
            return _batch_buffering(index, trigger, event, subscriber_repo)
        return type_mismatch(index, trigger.type, event.type)
    checks = compile_trigger(trigger)(event, workflow_name, subscriber_repo)
    return TriggerDecision(index, trigger.type, all(check.ok for check in checks), tuple(checks))


def match_workflow(
    workflow: WorkflowEntry, event: Event, *, subscriber_repo: str | None = None
) -> WorkflowDecision:
    """Evaluate every trigger of one workflow (OR); a workflow without triggers never matches."""
    return CompiledWorkflow(workflow).decide(event, subscriber_repo)


def match_workflows_reference(lock: Lock, event: Event, *, subscriber_repo: str | None = None) -> Decision:
    """The straightforward matcher: every trigger of every workflow evaluated for the event.

    It is the specification the indexed matcher (`matching.index.match_workflows`) must agree with,
    decision and trace alike; the equivalence tests and `bench/matching.py` compare the two.
    """
    return Decision(
        event=event_summary(event),
        lock_status="ok",
        schema_version=lock.schema_version,
        workflows=tuple(workflow.decide(event, subscriber_repo) for workflow in _compiled(lock)),
    )


def lock_error_decision(event: Event, code: str, schema_version: int | None = None) -> Decision:
    """The decision recorded when the lock could not be read (`lock_missing`, `lock_schema_too_new`, …)."""
    return Decision(event=event_summary(event), lock_status=code, schema_version=schema_version, workflows=())
