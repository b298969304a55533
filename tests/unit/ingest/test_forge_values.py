"""Forge and local payloads: every commit id, ref and repository name is checked before it is used (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from conveyor.ingest.providers.base import ParsedDelivery, Refused, SourceRow
from conveyor.ingest.providers.forge import normalise_forge
from conveyor.ingest.providers.local import LocalProvider
from conveyor.matching import Event

SHA = "a" * 40
SOURCE = SourceRow(
    id="s",
    org_id="default",
    name="app",
    kind="git",
    routing_key="git:app",
    repo="team/app",
    api_url=None,
    clone_url="file:///nowhere",
    default_branch="main",
    verify="none",
    signature_header=None,
    event_header=None,
    report="none",
    enabled=True,
)
PUSH: dict[str, Any] = {
    "ref": "refs/heads/main",
    "before": "0" * 40,
    "after": SHA,
    "repository": {"full_name": "team/app", "default_branch": "main"},
}
PULL: dict[str, Any] = {
    "action": "opened",
    "pull_request": {
        "number": 7,
        "base": {"ref": "main", "sha": "b" * 40},
        "head": {"ref": "feature/x", "sha": SHA, "repo": {"full_name": "fork/app"}},
    },
    "repository": {"full_name": "team/app"},
}


def normalised(event: str, payload: dict[str, Any]) -> Event | Refused:
    result = normalise_forge(SOURCE, ParsedDelivery(event, "d", None, payload), "row")
    assert isinstance(result, (Event, Refused)), result
    return result


def test_valid_push_and_pull_request_are_events() -> None:
    assert isinstance(normalised("push", PUSH), Event)
    assert isinstance(normalised("pull_request", PULL), Event)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"after": "--upload-pack=x"}, "after is not a commit id"),
        ({"after": SHA.upper()}, "after is not a commit id"),
        ({"before": "HEAD~1"}, "before is not a commit id"),
        ({"before": 3}, "before is not a commit id"),
        ({"ref": "refs/heads/a..b"}, "ref contains '..'"),
        ({"ref": "-refs"}, "ref starts with '-'"),
        ({"repository": {"full_name": "team/../x"}}, "repository has an empty, '.' or '..' path segment"),
        ({"repository": {"full_name": "team/app", "default_branch": "x:y"}}, "repository.default_branch"),
    ],
)
def test_a_push_with_an_invalid_value_is_refused_naming_the_field(
    change: dict[str, Any], reason: str
) -> None:
    result = normalised("push", {**PUSH, **change})
    assert isinstance(result, Refused) and result.reason.startswith(reason), result


def test_a_gitlab_push_with_a_hostile_checkout_sha_is_refused() -> None:
    payload = {
        "ref": "refs/heads/main",
        "after": None,
        "checkout_sha": "-x",
        "project": {"path_with_namespace": "g/p"},
    }
    result = normalised("push", payload)
    assert isinstance(result, Refused) and result.reason.startswith("after is not a commit id")


@pytest.mark.parametrize(
    ("path", "value", "reason"),
    [
        (("base", "ref"), "-main", "pull_request base branch starts with '-'"),
        (("head", "ref"), "a b", "pull_request head branch contains a control character"),
        (("head", "sha"), "--output=x", "pull_request head sha is not a commit id"),
        (("base", "sha"), "main", "pull_request base sha is not a commit id"),
        (("head", "repo"), {"full_name": "../x"}, "pull_request head repository"),
    ],
)
def test_a_pull_request_with_an_invalid_value_is_refused(
    path: tuple[str, str], value: Any, reason: str
) -> None:
    pr = {**PULL["pull_request"], path[0]: {**PULL["pull_request"][path[0]], path[1]: value}}
    result = normalised("pull_request", {**PULL, "pull_request": pr})
    assert isinstance(result, Refused) and result.reason.startswith(reason), result


@pytest.mark.parametrize(
    "payload",
    [
        {"ref": "--output=x", "sha": SHA},
        {"ref": "refs/heads/main", "sha": "-x"},
        {"ref": "refs/heads/main", "sha": SHA, "before": "HEAD"},
        {"sha": SHA},
    ],
)
def test_a_stored_local_trigger_with_an_invalid_value_is_refused(payload: dict[str, Any]) -> None:
    result = LocalProvider().normalise(SOURCE, ParsedDelivery("push", "d", None, payload), "row")
    assert isinstance(result, Refused), result
