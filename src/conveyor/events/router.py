"""Routing one leased event (docs/design/events.md §3.1, §3.3): a pure decision, then one dispatch
transaction."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from conveyor.events.models import (
    FAILED_BATCH,
    GENERIC_WEBHOOK,
    JOB_COMPLETE,
    SCHEDULE_FIRE,
    WORKFLOW_COMPLETE,
    NonRetryableEventError,
    kind_of,
    reserved_payload_problem,
)
from conveyor.events.registrations import Registration, RegistrationIndex
from conveyor.events.trust import Grant, TrustFacts, trust_allows
from conveyor.lockfile.models import WorkflowsFailedBatchTriggerEntry
from conveyor.matching import (
    Event,
    WorkflowDecision,
    completion_event,
    custom_event,
    failed_batch_event,
    generic_webhook_event,
    match_workflow,
    schedule_event,
)


@dataclass(frozen=True)
class EventView:
    """The parts of an event row the router reads."""

    id: str
    name: str
    origin: str
    org_id: str | None
    payload: Mapping[str, Any]
    source_routing_key: str | None = None
    source_repo: str | None = None
    target_repos: tuple[str, ...] | None = None
    chain_depth: int = 0

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> EventView:
        """From an `events` row."""
        targets = row.get("target_repos")
        return cls(
            id=row["id"],
            name=row["name"],
            origin=row["origin"],
            org_id=row["org_id"],
            payload=row["payload"] or {},
            source_routing_key=row["source_routing_key"],
            source_repo=row["source_repo"],
            target_repos=tuple(targets) if targets else None,
            chain_depth=int(row["chain_depth"] or 0),
        )


@dataclass(frozen=True)
class Dispatch:
    """One run to create for a registration."""

    registration: Registration
    decision: WorkflowDecision
    failure_lifecycle: bool


@dataclass(frozen=True)
class Buffer:
    """One failed run to append to a registration's batch window."""

    registration: Registration
    window_ms: int


@dataclass
class RouteDecision:
    """What to do with an event, and the outcome to record."""

    outcome: str
    dispatch: list[Dispatch] = field(default_factory=list)
    buffer: list[Buffer] = field(default_factory=list)
    event: Event | None = None


def _required(payload: Mapping[str, Any], key: str, name: str) -> Any:
    value = payload.get(key)
    if value is None:
        raise NonRetryableEventError(f"{name} payload has no {key}")
    return value


def matching_event(view: EventView) -> Event:
    """The normalised `Event` matching sees (docs/design/authoring.md §4); a bad reserved payload is
    non-retryable."""
    payload = dict(view.payload)
    problem = reserved_payload_problem(view.name, payload)
    if problem is not None:
        raise NonRetryableEventError(problem)
    try:
        if view.name in (WORKFLOW_COMPLETE, JOB_COMPLETE):
            _required(payload, "status", view.name)
            if view.name == WORKFLOW_COMPLETE:
                return completion_event(kind="workflow_complete", payload=payload, delivery_id=view.id)
            return completion_event(kind="job_complete", payload=payload, delivery_id=view.id)
        if view.name == SCHEDULE_FIRE:
            return schedule_event(repo=str(payload.get("repo", "")), payload=payload, delivery_id=view.id)
        if view.name == FAILED_BATCH:
            return failed_batch_event(repo=str(payload.get("repo", "")), payload=payload, delivery_id=view.id)
        if view.name == GENERIC_WEBHOOK:
            body = payload.get("body")
            if not isinstance(body, dict):
                raise NonRetryableEventError("__generic_webhook payload has no object body")
            return generic_webhook_event(
                source=str(_required(payload, "source", view.name)),
                event_name=payload.get("event"),
                body=body,
                repo=view.source_repo or "",
                delivery_id=view.id,
            )
        return custom_event(name=view.name, repo=view.source_repo or "", payload=payload, delivery_id=view.id)
    except (ValueError, TypeError) as exc:
        raise NonRetryableEventError(f"{view.name} payload is invalid: {exc}") from exc


def candidates(view: EventView, index: RegistrationIndex) -> list[Registration]:
    """docs/design/events.md §3.1 step 2: by kind within the event's org; targeted events take only their
    registration."""
    kind = kind_of(view.name)
    if view.name in (SCHEDULE_FIRE, FAILED_BATCH):
        registration_id = view.payload.get("registration_id")
        if not isinstance(registration_id, str) or not registration_id:
            raise NonRetryableEventError(f"{view.name} payload has no valid registration_id")
        found = index.by_id.get(registration_id)
        return [found] if found is not None and not found.disabled else []
    if view.org_id is None:
        targets = set(view.target_repos or ())
        return [r for r in index.by_kind_any_org.get(kind, []) if r.repo in targets]
    workflow = view.payload.get("workflow_name")
    found_list = list(
        index.candidates(view.org_id, kind, view.name, workflow if isinstance(workflow, str) else None)
    )
    if view.name == WORKFLOW_COMPLETE and view.payload.get("status") == "failed":
        seen = {r.id for r in found_list}
        found_list += [r for r in index.candidates(view.org_id, "workflows_failed_batch") if r.id not in seen]
        found_list.sort(key=lambda r: r.id)
    return found_list


def route(
    view: EventView,
    index: RegistrationIndex,
    grants: Iterable[Grant] = (),
    *,
    source_run_by_failure_lifecycle: bool = False,
) -> RouteDecision:
    """Decide the outcome and the runs/buffers of one event (pure; first applicable outcome of
    docs/design/events.md §3.3)."""
    event = matching_event(view)
    found = candidates(view, index)
    if not found:
        return RouteDecision("no-registration", event=event)
    if view.target_repos is not None:
        targets = set(view.target_repos)
        found = [r for r in found if r.repo in targets]
        if not found:
            return RouteDecision("no-target-repo", event=event)
    for registration in found:
        if registration.id in index.invalid:
            raise NonRetryableEventError(index.invalid[registration.id])
    facts = TrustFacts(view.name, view.origin, view.source_routing_key, view.source_repo)
    grant_list = list(grants)
    decision = RouteDecision("no-trigger-match", event=event)
    blocked = 0
    for registration in found:
        workflow_decision = match_workflow(registration.entry, event, subscriber_repo=registration.repo)
        buffered_trigger = next((t for t in workflow_decision.triggers if t.buffered), None)
        if not workflow_decision.matched and buffered_trigger is None:
            continue
        if not trust_allows(
            facts,
            org_id=registration.org_id,
            routing_key=registration.routing_key,
            repo=registration.repo,
            grants=grant_list,
        ):
            blocked += 1
            continue
        if workflow_decision.matched:
            assert workflow_decision.matched_trigger is not None
            trigger = registration.entry.triggers[workflow_decision.matched_trigger]
            decision.dispatch.append(
                Dispatch(registration, workflow_decision, trigger.type == "workflows_failed_batch")
            )
        elif buffered_trigger is not None and not source_run_by_failure_lifecycle:
            trigger = registration.entry.triggers[buffered_trigger.index]
            assert isinstance(trigger, WorkflowsFailedBatchTriggerEntry)
            decision.buffer.append(Buffer(registration, trigger.window_ms))
    if decision.dispatch:
        decision.outcome = "matched"
    elif decision.buffer:
        decision.outcome = "buffered"
    elif blocked:
        decision.outcome = "trust-blocked"
    return decision


def run_event(event: Event, registration: Registration) -> Event:
    """The event stored with the run: the subscriber's repository at its registered commit and branch."""
    branch = registration.default_branch
    return event.model_copy(
        update={
            "repo": registration.repo,
            "sha": registration.commit_sha,
            "ref": f"refs/heads/{branch}" if branch else None,
            "branch": branch,
            "default_branch": branch,
        }
    )
