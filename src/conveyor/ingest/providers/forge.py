"""Normalising forge push and pull-request payloads (GitHub-style, Gitea, Gogs, GitLab) into events."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from conveyor.ingest.providers.base import Ignored, ParsedDelivery, Refused, SourceRow
from conveyor.ingest.providers.parsing import changed_files_from_commits
from conveyor.matching import Event, pr_event, ref_event
from conveyor.model.errors import clip
from conveyor.model.gitnames import commit_id_problem, ref_problem, repo_name_problem

GITHUB_COMMIT_CAP = 2048


def _dig(payload: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(payload, dict):
            return None
        payload = payload.get(key)
    return payload


def _payload_repo(payload: dict[str, Any]) -> str | None:
    for candidate in (
        _dig(payload, "repository", "full_name"),
        _dig(payload, "project", "path_with_namespace"),
    ):
        if isinstance(candidate, str) and candidate:
            return candidate
    return None


def repo_name(source: SourceRow, payload: dict[str, Any]) -> str:
    """`owner/name` from the payload, else the source's own repo."""
    return _payload_repo(payload) or source.repo


Check = tuple[str, Any, Callable[[object], str | None]]


def refusal(checks: list[Check]) -> Refused | None:
    """The first payload value that is not what its field must be (absent optional values are skipped)."""
    for field, value, problem_of in checks:
        if value is None:
            continue
        problem = problem_of(value)
        if problem is not None:
            shown = clip(value, 80) if isinstance(value, str) else type(value).__name__
            return Refused(f"{field} {problem}: {shown!r}")
    return None


def normalise_forge(
    source: SourceRow, delivery: ParsedDelivery, delivery_row_id: str
) -> Event | Ignored | Refused:
    """A push or pull request as a matching `Event`; anything else is ignored.

    Every commit id, ref and repository name the event takes from the payload is checked first: one that
    is not valid refuses the delivery, so it never reaches `git` or a forge API as an argument.
    """
    payload = delivery.payload
    repo = repo_name(source, payload)
    payload_default = _dig(payload, "repository", "default_branch")
    default_branch = payload_default or source.default_branch
    sender = _dig(payload, "sender", "login") or _dig(payload, "user_username")
    common: list[Check] = [
        ("repository", _payload_repo(payload), repo_name_problem),
        ("repository.default_branch", payload_default or None, ref_problem),
    ]
    if delivery.event == "push":
        ref, after = payload.get("ref"), payload.get("after") or payload.get("checkout_sha")
        if not isinstance(ref, str) or not isinstance(after, str):
            return Ignored("push payload without ref or after")
        refused = refusal(
            [
                *common,
                ("ref", ref, ref_problem),
                ("after", after, commit_id_problem),
                ("before", payload.get("before"), commit_id_problem),
            ]
        )
        if refused is not None:
            return refused
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
        refused = refusal(
            [
                *common,
                ("pull_request base branch", base, ref_problem),
                ("pull_request head branch", head, ref_problem),
                ("pull_request head sha", sha, commit_id_problem),
                # A fork's pull request reads the lock at the base commit (pipeline.lock_sha_of).
                ("pull_request base sha", _dig(pr, "base", "sha"), commit_id_problem),
                ("pull_request head repository", head_repo, repo_name_problem),
            ]
        )
        if refused is not None:
            return refused
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
