"""Normalising forge push and pull-request payloads (GitHub-style, Gitea, Gogs, GitLab) into events."""

from __future__ import annotations

from typing import Any

from conveyor.ingest.providers.base import Ignored, ParsedDelivery, SourceRow
from conveyor.ingest.providers.parsing import changed_files_from_commits
from conveyor.matching import Event, pr_event, ref_event

GITHUB_COMMIT_CAP = 2048


def _dig(payload: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(payload, dict):
            return None
        payload = payload.get(key)
    return payload


def repo_name(source: SourceRow, payload: dict[str, Any]) -> str:
    """`owner/name` from the payload, else the source's own repo."""
    for candidate in (
        _dig(payload, "repository", "full_name"),
        _dig(payload, "project", "path_with_namespace"),
    ):
        if isinstance(candidate, str) and candidate:
            return candidate
    return source.repo


def normalise_forge(source: SourceRow, delivery: ParsedDelivery, delivery_row_id: str) -> Event | Ignored:
    """A push or pull request as a matching `Event`; anything else is ignored."""
    payload = delivery.payload
    repo = repo_name(source, payload)
    default_branch = _dig(payload, "repository", "default_branch") or source.default_branch
    sender = _dig(payload, "sender", "login") or _dig(payload, "user_username")
    if delivery.event == "push":
        ref, after = payload.get("ref"), payload.get("after") or payload.get("checkout_sha")
        if not isinstance(ref, str) or not isinstance(after, str):
            return Ignored("push payload without ref or after")
        commits = payload.get("commits")
        truncated = isinstance(commits, list) and len(commits) >= GITHUB_COMMIT_CAP
        return ref_event(
            repo=repo,
            ref=ref,
            sha=after,
            before=payload.get("before") if isinstance(payload.get("before"), str) else None,
            source=source.kind,
            delivery_id=delivery_row_id,
            default_branch=default_branch if isinstance(default_branch, str) else None,
            changed_files=changed_files_from_commits(payload),
            changes_truncated=truncated,
            sender=sender if isinstance(sender, str) else None,
            payload=payload,
        )
    if delivery.event == "pull_request":
        pr = payload.get("pull_request") or payload.get("object_attributes")
        if not isinstance(pr, dict):
            return Ignored("pull_request payload without pull_request")
        number = pr.get("number") or pr.get("iid")
        base = _dig(pr, "base", "ref") or pr.get("target_branch")
        head = _dig(pr, "head", "ref") or pr.get("source_branch")
        sha = _dig(pr, "head", "sha") or _dig(pr, "last_commit", "id")
        if not isinstance(number, int) or not isinstance(base, str):
            return Ignored("pull_request payload without number or base branch")
        head_repo = _dig(pr, "head", "repo", "full_name")
        action = (
            delivery.action or (pr.get("action") if isinstance(pr.get("action"), str) else None) or "opened"
        )
        action = {"open": "opened", "update": "synchronize", "reopen": "reopened", "close": "closed"}.get(
            action, action
        )
        return pr_event(
            repo=repo,
            action=action,
            pr_number=number,
            base_branch=base,
            head_branch=head if isinstance(head, str) else None,
            sha=sha if isinstance(sha, str) else None,
            head_repo=head_repo if isinstance(head_repo, str) else None,
            source=source.kind,
            delivery_id=delivery_row_id,
            default_branch=default_branch if isinstance(default_branch, str) else None,
            changed_files=None,
            sender=sender if isinstance(sender, str) else None,
            payload=payload,
        )
    return Ignored(f"event {delivery.event!r} starts no workflow")
