"""The normalised event (docs/design/authoring.md §4) and pure constructors that build it from each source's
facts."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

EventType = Literal[
    "push",
    "tag",
    "pr",
    "dispatch",
    "schedule",
    "event",
    "workflow_complete",
    "job_complete",
    "workflows_failed_batch",
    "generic_webhook",
]
EVENT_TYPES: tuple[str, ...] = EventType.__args__  # type: ignore[attr-defined]
MAX_CHANGED_FILES = 3000
NULL_SHA = "0" * 40


class Event(BaseModel):
    """What every source produces and the matcher reads. `changed_files=None` means unknown."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: EventType
    action: str | None = None
    repo: str
    source: str = "local"
    delivery_id: str = ""
    ref: str | None = None
    branch: str | None = None
    tag: str | None = None
    base_branch: str | None = None
    head_branch: str | None = None
    pr_number: int | None = None
    sha: str | None = None
    before: str | None = None
    default_branch: str | None = None
    changed_files: list[str] | None = None
    sender: str | None = None
    is_fork: bool = False
    payload: dict[str, Any] = Field(default_factory=dict)


def normalize_changed_files(files: Iterable[str] | None) -> list[str] | None:
    """Repo-relative POSIX paths, sorted and unique; None when unknown or over 3,000 files."""
    if files is None:
        return None
    cleaned = sorted({path.replace("\\", "/").removeprefix("./") for path in files if path})
    return None if len(cleaned) > MAX_CHANGED_FILES else cleaned


def _is_null_sha(sha: str | None) -> bool:
    return sha is None or sha == "" or set(sha) == {"0"}


def previous_tip(*, ref_tip: str | None, sha: str | None, parent: str | None) -> str | None:
    """The `before` of a ref update whose caller did not name one (preview, run local, trigger-local).

    While the ref still points elsewhere, a push is about to replace its tip: that tip. Once the ref
    already points at `sha` (a commit just made, a trigger after the fact), what `sha` replaced is its
    first parent. None (a created ref: changed files unknown) for a ref that does not exist yet, a root
    commit, or no commit at all. The changed files are then the diff `before..sha`, the same set the
    orchestrator computes for the same two commits.
    """
    if sha is None or ref_tip is None:
        return None
    if ref_tip != sha:
        return ref_tip
    return parent


def ref_event(
    *,
    repo: str,
    ref: str,
    sha: str | None,
    before: str | None,
    source: str = "local",
    delivery_id: str = "",
    default_branch: str | None = None,
    changed_files: Iterable[str] | None = None,
    changes_truncated: bool = False,
    sender: str | None = None,
    payload: Mapping[str, Any] | None = None,
) -> Event:
    """A git ref update: `refs/tags/*` is a `tag` event, anything else a `push`.

    The action is `created` when `before` is null (all zeros), `deleted` when `sha` is; changed files are
    unknown (None) then, and when the provider's list was truncated.
    """
    created, deleted = _is_null_sha(before), _is_null_sha(sha)
    action = "deleted" if deleted else "created" if created else "updated"
    is_tag = ref.startswith("refs/tags/")
    known_files = (
        None if (created or deleted or changes_truncated) else normalize_changed_files(changed_files)
    )
    return Event(
        type="tag" if is_tag else "push",
        action=action,
        repo=repo,
        source=source,
        delivery_id=delivery_id,
        ref=ref,
        branch=None if is_tag else ref.removeprefix("refs/heads/"),
        tag=ref.removeprefix("refs/tags/") if is_tag else None,
        sha=None if deleted else sha,
        before=None if created else before,
        default_branch=default_branch,
        changed_files=None if is_tag else known_files,
        sender=sender,
        payload=dict(payload or {}),
    )


def pr_event(
    *,
    repo: str,
    action: str,
    pr_number: int,
    base_branch: str,
    head_branch: str | None,
    sha: str | None,
    head_repo: str | None = None,
    source: str = "local",
    delivery_id: str = "",
    before: str | None = None,
    default_branch: str | None = None,
    changed_files: Iterable[str] | None = None,
    sender: str | None = None,
    payload: Mapping[str, Any] | None = None,
) -> Event:
    """A pull-request event; `is_fork` when the head repository differs from the base one."""
    return Event(
        type="pr",
        action=action,
        repo=repo,
        source=source,
        delivery_id=delivery_id,
        ref=f"refs/pull/{pr_number}/head",
        branch=head_branch,
        base_branch=base_branch,
        head_branch=head_branch,
        pr_number=pr_number,
        sha=sha,
        before=before,
        default_branch=default_branch,
        changed_files=normalize_changed_files(changed_files),
        sender=sender,
        is_fork=head_repo is not None and head_repo != repo,
        payload=dict(payload or {}),
    )


def dispatch_event(
    *,
    repo: str,
    dispatch_type: str = "manual",
    inputs: Mapping[str, Any] | None = None,
    branch: str | None = None,
    default_branch: str | None = None,
    sha: str | None = None,
    source: str = "local",
    delivery_id: str = "",
    sender: str | None = None,
) -> Event:
    """A manual or API dispatch; `branch` defaults to the default branch."""
    run_branch = branch or default_branch
    return Event(
        type="dispatch",
        action=dispatch_type,
        repo=repo,
        source=source,
        delivery_id=delivery_id,
        ref=f"refs/heads/{run_branch}" if run_branch else None,
        branch=run_branch,
        sha=sha,
        default_branch=default_branch,
        sender=sender,
        payload={"inputs": dict(inputs or {})},
    )


def schedule_event(
    *,
    repo: str,
    payload: Mapping[str, Any],
    default_branch: str | None = None,
    sha: str | None = None,
    source: str = "cron",
    delivery_id: str = "",
) -> Event:
    """A cron fire (`payload`: `workflow_name, cron, timezone, slot_at, …`), run on the default branch."""
    return Event(
        type="schedule",
        repo=repo,
        source=source,
        delivery_id=delivery_id,
        ref=f"refs/heads/{default_branch}" if default_branch else None,
        branch=default_branch,
        sha=sha or payload.get("commit_sha"),
        default_branch=default_branch,
        payload=dict(payload),
    )


def custom_event(
    *,
    name: str,
    repo: str,
    payload: Mapping[str, Any] | None = None,
    source: str = "events",
    delivery_id: str = "",
    sender: str | None = None,
) -> Event:
    """A custom event (`ctx.emit`) or a `conveyor.*` system event; `repo` is the emitter's ("" for org-wide)."""
    return Event(
        type="event",
        action=name,
        repo=repo,
        source=source,
        delivery_id=delivery_id,
        sender=sender,
        payload=dict(payload or {}),
    )


def completion_event(
    *,
    kind: Literal["workflow_complete", "job_complete"],
    payload: Mapping[str, Any],
    source: str = "events",
    delivery_id: str = "",
) -> Event:
    """A run or job reached a terminal status (`payload`: `run_id, workflow_name, job_name?, status, repo, …`)."""
    return Event(
        type=kind,
        action=str(payload["status"]),
        repo=str(payload.get("repo", "")),
        source=source,
        delivery_id=delivery_id,
        sender=payload.get("sender"),
        payload=dict(payload),
    )


def failed_batch_event(
    *, repo: str, payload: Mapping[str, Any], source: str = "events", delivery_id: str = ""
) -> Event:
    """A closed failure-batch window (`payload`: `total, runs[]`, …) for its own registration."""
    return Event(
        type="workflows_failed_batch",
        repo=repo,
        source=source,
        delivery_id=delivery_id,
        payload=dict(payload),
    )


def generic_webhook_event(
    *, source: str, event_name: str | None, body: Mapping[str, Any], repo: str = "", delivery_id: str = ""
) -> Event:
    """A non-git webhook from the configured source `source`, mapped to `event_name`."""
    return Event(
        type="generic_webhook",
        action=event_name,
        repo=repo,
        source=source,
        delivery_id=delivery_id,
        payload=dict(body),
    )


def event_summary(event: Event) -> dict[str, Any]:
    """The event fields a decision trace shows."""
    return {
        "type": event.type,
        "action": event.action,
        "repo": event.repo,
        "ref": event.ref,
        "branch": event.branch,
        "tag": event.tag,
        "base_branch": event.base_branch,
        "head_branch": event.head_branch,
        "sha": event.sha,
        "changed_files": event.changed_files,
    }
