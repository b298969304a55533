"""Turning `EVENT` plus the shared event flags into a normalised event, for preview, fixture and run local."""

from __future__ import annotations

import json
from collections.abc import Callable
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


@dataclass(frozen=True, slots=True)
class _Local:
    """What every event built from the working tree shares: the request and what git says about it."""

    spec: EventSpec
    flags: EventFlags
    root: Path
    lock: Lock | None
    forge_payload: bool
    payload: dict[str, Any]
    repo: str
    default_branch: str
    sender: str | None
    sha: str | None
    common: dict[str, Any]


def _ref_event(local: _Local) -> Event:
    from conveyor.matching.event import previous_tip, ref_event

    flags, root, sha = local.flags, local.root, local.sha
    if local.spec.kind == "tag":
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
        repo=local.repo,
        ref=ref,
        sha=sha or "f" * 40,
        before=before,
        default_branch=local.default_branch,
        changed_files=git.push_changed_files(root),
        sender=local.sender,
        payload=local.payload,
        **local.common,
    )
    if local.spec.kind == "push" and (flags.files is not None or flags.no_files):
        event = event.model_copy(update={"changed_files": _changed_files(flags, None)})
    if local.forge_payload and not local.payload:
        event = event.model_copy(update={"payload": _forge_push_payload(event, local.sender)})
    return event


def _pr_event(local: _Local) -> Event:
    from conveyor.matching.event import pr_event

    flags = local.flags
    base = flags.base or local.default_branch
    head = flags.head or flags.branch or git.current_branch(local.root)
    if not head:
        raise EventUsageError("detached HEAD: pass --branch or --head")
    default_files = (
        None if (flags.files is not None or flags.no_files) else git.pr_changed_files(local.root, base)
    )
    event = pr_event(
        repo=local.repo,
        action=local.spec.detail or "opened",
        pr_number=1,
        base_branch=base,
        head_branch=head,
        sha=local.sha,
        default_branch=local.default_branch,
        changed_files=_changed_files(flags, default_files),
        sender=local.sender,
        payload=local.payload,
        **local.common,
    )
    if local.forge_payload and not local.payload:
        event = event.model_copy(update={"payload": _forge_pr_payload(event, local.sender)})
    return event


def _dispatch_event(local: _Local) -> Event:
    from conveyor.matching.event import dispatch_event

    inputs = dict(_key_value(item, "--input") for item in local.flags.inputs)
    return dispatch_event(
        repo=local.repo,
        dispatch_type=local.spec.detail or "manual",
        inputs={**local.payload.get("inputs", {}), **inputs},
        branch=local.flags.branch or git.current_branch(local.root),
        default_branch=local.default_branch,
        sha=local.sha,
        sender=local.sender,
        **local.common,
    )


def _schedule_event(local: _Local) -> Event:
    from conveyor.matching.event import schedule_event

    flags = local.flags
    trigger = _schedule_trigger(local.lock, flags.workflow, flags.cron)
    fire = {
        "workflow_name": flags.workflow,
        "repo": local.repo,
        "cron": trigger.cron,
        "timezone": trigger.timezone,
        "slot_at": datetime.now(UTC).replace(second=0, microsecond=0).isoformat(),
        "commit_sha": local.sha,
        **local.payload,
    }
    return schedule_event(
        repo=local.repo,
        payload=fire,
        default_branch=flags.branch or local.default_branch,
        sha=local.sha,
        **local.common,
    )


def _custom_event(local: _Local) -> Event:
    from conveyor.matching.event import custom_event

    return custom_event(
        name=local.spec.detail or "",
        repo=local.repo,
        payload=local.payload,
        sender=local.sender,
        **local.common,
    )


def _completion_event(local: _Local) -> Event:
    from conveyor.matching.event import completion_event

    kind = local.spec.kind
    completion = {
        "run_id": "local-run",
        "workflow_name": None,
        "status": local.spec.detail,
        "repo": local.repo,
        **local.payload,
    }
    if kind == "job_complete":
        completion.setdefault("job_name", None)
    return completion_event(kind=kind, payload=completion, **local.common)  # type: ignore[arg-type]


def _generic_webhook_event(local: _Local) -> Event:
    from conveyor.matching.event import generic_webhook_event

    return generic_webhook_event(
        source=local.spec.detail or "",
        event_name=local.spec.extra,
        body=local.payload,
        repo=local.repo,
        delivery_id=local.common["delivery_id"],
    )


# The builder of each EVENT type parse_event_spec names (a fixture, `@NAME`, is read, not built).
_BUILDERS: dict[str, Callable[[_Local], Event]] = {
    "push": _ref_event,
    "tag": _ref_event,
    "pr": _pr_event,
    "dispatch": _dispatch_event,
    "schedule": _schedule_event,
    "event": _custom_event,
    "workflow_complete": _completion_event,
    "job_complete": _completion_event,
    "generic_webhook": _generic_webhook_event,
}


def build_event(
    spec: EventSpec, flags: EventFlags, root: Path, lock: Lock | None, *, forge_payload: bool = False
) -> Event:
    """Build the normalised event for `spec`, filling what flags leave open from git
    (docs/design/authoring.md §6)."""
    if flags.event_file is not None:
        return _validated(_read_json_object(flags.event_file, "--event-file"), str(flags.event_file))
    if spec.kind == "@":
        path = root / ".conveyor" / "fixtures" / f"{spec.detail}.json"
        if not path.is_file():
            raise EventInvalid(f"fixture @{spec.detail} not found at .conveyor/fixtures/{spec.detail}.json")
        return _validated(_read_json_object(path, "fixture"), f".conveyor/fixtures/{spec.detail}.json")

    payload: dict[str, Any] = _read_json_object(flags.payload_file, "--payload") if flags.payload_file else {}
    local = _Local(
        spec=spec,
        flags=flags,
        root=root,
        lock=lock,
        forge_payload=forge_payload,
        payload=payload,
        repo=git.repo_name(root),
        default_branch=git.default_branch(root),
        sender=git.user_name(root),
        sha=flags.sha or git.commit_sha(root, "HEAD"),
        common={"source": "local", "delivery_id": _delivery_id()},
    )
    event = _BUILDERS.get(spec.kind, _generic_webhook_event)(local)

    if flags.set_values:
        document = event.model_dump()
        for item in flags.set_values:
            key, value = _key_value(item, "--set")
            _set_path(document["payload"], key, _json_or_text(value))
        event = _validated(document, "--set")
    return event
