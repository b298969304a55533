"""Turning `EVENT` plus the shared event flags into a normalised event, for preview, fixture and run local."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from conveyor.cli import authoring_git as git
from conveyor.errors import ConveyorError

if TYPE_CHECKING:  # pydantic models load only in the commands that build an event (a fast CLI)
    from conveyor.lockfile.models import Lock, ScheduleTriggerEntry
    from conveyor.matching.event import Event

EVENT_FORMS = (
    "push",
    "tag",
    "pr[:ACTION]",
    "dispatch[:TYPE]",
    "schedule",
    "event:NAME",
    "workflow_complete[:STATUS]",
    "job_complete[:STATUS]",
    "generic_webhook:SOURCE[:EVENT]",
    "@NAME",
)


class EventUsageError(ConveyorError):
    """A malformed EVENT or flag combination (exit 2)."""


class EventInvalid(ConveyorError):
    """A well-formed request that cannot produce a valid event (exit 1)."""


@dataclass(frozen=True, slots=True)
class EventSpec:
    """A parsed EVENT argument: its type and the optional part after the colon."""

    kind: str
    detail: str | None = None
    extra: str | None = None


def parse_event_spec(text: str) -> EventSpec:
    """Parse `pr:opened`, `event:deploy`, `@saved`, ...; anything else is an `EventUsageError`."""
    from conveyor.sdk.triggers import JOB_TERMINAL_STATUSES, PR_ACTIONS, WORKFLOW_TERMINAL_STATUSES

    forms = ", ".join(EVENT_FORMS)
    if text.startswith("@") and len(text) > 1:
        return EventSpec("@", text[1:])
    kind, _, rest = text.partition(":")
    detail = rest or None
    if kind in ("push", "tag", "schedule") and detail is None:
        return EventSpec(kind)
    if kind == "pr":
        if detail is not None and detail not in PR_ACTIONS:
            raise EventUsageError(f"unknown pr action {detail!r}; valid: {', '.join(PR_ACTIONS)}")
        return EventSpec("pr", detail or "opened")
    if kind == "dispatch":
        return EventSpec("dispatch", detail or "manual")
    if kind == "event" and detail:
        return EventSpec("event", detail)
    if kind in ("workflow_complete", "job_complete"):
        allowed = WORKFLOW_TERMINAL_STATUSES if kind == "workflow_complete" else JOB_TERMINAL_STATUSES
        if detail is not None and detail not in allowed:
            raise EventUsageError(f"unknown {kind} status {detail!r}; valid: {', '.join(allowed)}")
        return EventSpec(kind, detail or "success")
    if kind == "generic_webhook" and detail:
        source, _, name = detail.partition(":")
        return EventSpec("generic_webhook", source, name or None)
    raise EventUsageError(f"invalid EVENT {text!r}; valid forms: {forms}")


@dataclass
class EventFlags:
    """The event flags shared by preview, run local and fixture."""

    branch: str | None = None
    tag: str | None = None
    base: str | None = None
    head: str | None = None
    sha: str | None = None
    files: list[str] | None = None
    no_files: bool = False
    payload_file: Path | None = None
    set_values: list[str] = field(default_factory=list)
    event_file: Path | None = None
    inputs: list[str] = field(default_factory=list)
    cron: str | None = None
    workflow: str | None = None


def _split_files(values: list[str]) -> list[str]:
    files: list[str] = []
    for value in values:
        files.extend(part.strip() for part in value.split(",") if part.strip())
    return files


def _key_value(text: str, what: str) -> tuple[str, str]:
    key, separator, value = text.partition("=")
    if not separator or not key:
        raise EventUsageError(f"{what} expects KEY=VALUE, got {text!r}")
    return key, value


def _json_or_text(value: str) -> Any:
    try:
        return json.loads(value)
    except ValueError:
        return value


def _set_path(payload: dict[str, Any], path: str, value: Any) -> None:
    target = payload
    *parents, last = path.split(".")
    for key in parents:
        child = target.get(key)
        if not isinstance(child, dict):
            child = target[key] = {}
        target = child
    target[last] = value


def _read_json_object(path: Path, what: str) -> dict[str, Any]:
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise EventInvalid(f"{what} {path}: {error}") from None
    if not isinstance(document, dict):
        raise EventInvalid(f"{what} {path}: must hold a JSON object")
    return document


def _validated(document: dict[str, Any], where: str) -> Event:
    from pydantic import ValidationError

    from conveyor.matching.event import Event

    try:
        return Event.model_validate(document)
    except ValidationError as error:
        first = error.errors()[0]
        location = ".".join(str(part) for part in first["loc"])
        raise EventInvalid(f"{where}: not a normalised event ({location}: {first['msg']})") from None


def _delivery_id() -> str:
    import uuid6

    return f"local-{uuid6.uuid7()}"


def _changed_files(flags: EventFlags, default: list[str] | None) -> list[str] | None:
    if flags.no_files:
        return None
    if flags.files is not None:
        return _split_files(flags.files)
    return default


def _forge_push_payload(event: Event, sender: str | None) -> dict[str, Any]:
    return {
        "ref": event.ref,
        "before": event.before or "0" * 40,
        "after": event.sha or "0" * 40,
        "created": event.action == "created",
        "deleted": event.action == "deleted",
        "repository": {"full_name": event.repo, "default_branch": event.default_branch},
        "sender": {"login": sender},
        "commits": [] if event.sha is None else [{"id": event.sha, "modified": event.changed_files or []}],
    }


def _forge_pr_payload(event: Event, sender: str | None) -> dict[str, Any]:
    return {
        "action": event.action,
        "number": event.pr_number,
        "pull_request": {
            "number": event.pr_number,
            "base": {"ref": event.base_branch, "repo": {"full_name": event.repo}},
            "head": {"ref": event.head_branch, "sha": event.sha, "repo": {"full_name": event.repo}},
        },
        "repository": {"full_name": event.repo, "default_branch": event.default_branch},
        "sender": {"login": sender},
    }


def _schedule_trigger(lock: Lock | None, workflow: str | None, cron: str | None) -> ScheduleTriggerEntry:
    from conveyor.lockfile.models import ScheduleTriggerEntry

    if workflow is None:
        raise EventUsageError("schedule needs --workflow W (the workflow whose schedule fires)")
    entry = lock.workflow(workflow) if lock is not None else None
    if entry is None:
        raise EventInvalid(f"schedule: no workflow named {workflow!r}")
    schedules = [t for t in entry.triggers if isinstance(t, ScheduleTriggerEntry)]
    if cron is not None:
        schedules = [t for t in schedules if t.cron == " ".join(cron.split())]
    if not schedules:
        wanted = f" with cron {cron!r}" if cron else ""
        raise EventInvalid(f"schedule: workflow {workflow!r} has no schedule trigger{wanted}")
    return schedules[0]


def build_event(
    spec: EventSpec, flags: EventFlags, root: Path, lock: Lock | None, *, forge_payload: bool = False
) -> Event:
    """Build the normalised event for `spec`, filling what flags leave open from git
    (docs/design/authoring.md §6)."""
    from conveyor.matching.event import (
        completion_event,
        custom_event,
        dispatch_event,
        generic_webhook_event,
        pr_event,
        previous_tip,
        ref_event,
        schedule_event,
    )

    if flags.event_file is not None:
        return _validated(_read_json_object(flags.event_file, "--event-file"), str(flags.event_file))
    if spec.kind == "@":
        path = root / ".conveyor" / "fixtures" / f"{spec.detail}.json"
        if not path.is_file():
            raise EventInvalid(f"fixture @{spec.detail} not found at .conveyor/fixtures/{spec.detail}.json")
        return _validated(_read_json_object(path, "fixture"), f".conveyor/fixtures/{spec.detail}.json")

    payload: dict[str, Any] = _read_json_object(flags.payload_file, "--payload") if flags.payload_file else {}
    repo = git.repo_name(root)
    default_branch = git.default_branch(root)
    sender = git.user_name(root)
    sha = flags.sha or git.commit_sha(root, "HEAD")
    common: dict[str, Any] = {"source": "local", "delivery_id": _delivery_id()}
    event: Event

    if spec.kind in ("push", "tag"):
        if spec.kind == "tag":
            if not flags.tag:
                raise EventUsageError("tag needs --tag T")
            ref = f"refs/tags/{flags.tag}"
            before = None
        else:
            branch = flags.branch or git.current_branch(root)
            if not branch:
                raise EventUsageError("detached HEAD: pass --branch B")
            ref = f"refs/heads/{branch}"
            before = previous_tip(
                ref_tip=git.commit_sha(root, ref),
                sha=sha,
                parent=git.commit_sha(root, f"{sha}~1") if sha else None,
            )
        event = ref_event(
            repo=repo,
            ref=ref,
            sha=sha or "f" * 40,
            before=before,
            default_branch=default_branch,
            changed_files=git.push_changed_files(root),
            sender=sender,
            payload=payload,
            **common,
        )
        if spec.kind == "push" and (flags.files is not None or flags.no_files):
            event = event.model_copy(update={"changed_files": _changed_files(flags, None)})
        if forge_payload and not payload:
            event = event.model_copy(update={"payload": _forge_push_payload(event, sender)})
    elif spec.kind == "pr":
        base = flags.base or default_branch
        head = flags.head or flags.branch or git.current_branch(root)
        if not head:
            raise EventUsageError("detached HEAD: pass --branch or --head")
        default_files = (
            None if (flags.files is not None or flags.no_files) else git.pr_changed_files(root, base)
        )
        event = pr_event(
            repo=repo,
            action=spec.detail or "opened",
            pr_number=1,
            base_branch=base,
            head_branch=head,
            sha=sha,
            default_branch=default_branch,
            changed_files=_changed_files(flags, default_files),
            sender=sender,
            payload=payload,
            **common,
        )
        if forge_payload and not payload:
            event = event.model_copy(update={"payload": _forge_pr_payload(event, sender)})
    elif spec.kind == "dispatch":
        inputs = dict(_key_value(item, "--input") for item in flags.inputs)
        event = dispatch_event(
            repo=repo,
            dispatch_type=spec.detail or "manual",
            inputs={**payload.get("inputs", {}), **inputs},
            branch=flags.branch or git.current_branch(root),
            default_branch=default_branch,
            sha=sha,
            sender=sender,
            **common,
        )
    elif spec.kind == "schedule":
        trigger = _schedule_trigger(lock, flags.workflow, flags.cron)
        fire = {
            "workflow_name": flags.workflow,
            "repo": repo,
            "cron": trigger.cron,
            "timezone": trigger.timezone,
            "slot_at": datetime.now(UTC).replace(second=0, microsecond=0).isoformat(),
            "commit_sha": sha,
            **payload,
        }
        event = schedule_event(
            repo=repo, payload=fire, default_branch=flags.branch or default_branch, sha=sha, **common
        )
    elif spec.kind == "event":
        event = custom_event(name=spec.detail or "", repo=repo, payload=payload, sender=sender, **common)
    elif spec.kind in ("workflow_complete", "job_complete"):
        completion = {
            "run_id": "local-run",
            "workflow_name": None,
            "status": spec.detail,
            "repo": repo,
            **payload,
        }
        if spec.kind == "job_complete":
            completion.setdefault("job_name", None)
        event = completion_event(kind=spec.kind, payload=completion, **common)  # type: ignore[arg-type]
    else:
        event = generic_webhook_event(
            source=spec.detail or "",
            event_name=spec.extra,
            body=payload,
            repo=repo,
            delivery_id=common["delivery_id"],
        )

    if flags.set_values:
        document = event.model_dump()
        for item in flags.set_values:
            key, value = _key_value(item, "--set")
            _set_path(document["payload"], key, _json_or_text(value))
        event = _validated(document, "--set")
    return event
