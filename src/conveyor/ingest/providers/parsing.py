"""Reading webhook headers and bodies (pure): GitHub's format and other forges' variants."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qs

from conveyor.ingest.providers.base import InvalidRequest, ParsedDelivery
from conveyor.model.storable import Unstorable, loads_storable

GIT_EVENT_HEADERS = ("x-github-event", "x-gitea-event", "x-gogs-event", "x-gitlab-event")
GIT_DELIVERY_HEADERS = ("x-github-delivery", "x-gitea-delivery", "x-gogs-delivery", "x-gitlab-event-uuid")
# Headers kept with a stored delivery (never Authorization or signatures' secrets).
STORED_HEADERS = (
    *GIT_EVENT_HEADERS,
    *GIT_DELIVERY_HEADERS,
    "content-type",
    "user-agent",
    "x-hub-signature-256",
)


# Longest event name, action or delivery id a delivery may carry; GitHub's are well under 100.
MAX_NAME_CHARS = 256


def decode_body(headers: Mapping[str, str], body: bytes) -> dict[str, Any]:
    """JSON body, or GitHub's form encoding with a `payload` field.

    Every body that cannot be decoded or stored is an `InvalidRequest`: bad UTF-8 or JSON, nesting deeper
    than the decoder's recursion limit, an integer longer than Python's digit limit, NaN or Infinity, or a
    NUL character (`\u0000`) in any string.
    """
    content_type = headers.get("content-type", "")
    try:
        if content_type.startswith("application/x-www-form-urlencoded"):
            fields = parse_qs(body.decode("utf-8"))
            if "payload" not in fields:
                raise InvalidRequest("form-encoded body has no payload field")
            document = loads_storable(fields["payload"][0])
        else:
            document = loads_storable(body)
    except Unstorable as exc:
        raise InvalidRequest(f"body {exc}") from exc
    except RecursionError as exc:
        raise InvalidRequest("body is not valid JSON: nested too deeply") from exc
    except UnicodeDecodeError as exc:
        raise InvalidRequest(f"body is not valid UTF-8 (at byte {exc.start})") from exc
    except json.JSONDecodeError as exc:
        raise InvalidRequest(
            f"body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from exc
    except ValueError as exc:  # e.g. an integer past sys.get_int_max_str_digits()
        raise InvalidRequest("body is not valid JSON: a value cannot be decoded") from exc
    if not isinstance(document, dict):
        raise InvalidRequest("body must be a JSON object")
    return document


def parse_github(headers: Mapping[str, str], body: bytes) -> ParsedDelivery:
    """GitHub format: `X-GitHub-Event` and `X-GitHub-Delivery` are required."""
    event = headers.get("x-github-event")
    if not event:
        raise InvalidRequest("missing header X-GitHub-Event")
    delivery = headers.get("x-github-delivery")
    if not delivery:
        raise InvalidRequest("missing header X-GitHub-Delivery")
    payload = decode_body(headers, body)
    action = payload.get("action") if isinstance(payload.get("action"), str) else None
    return ParsedDelivery(event=event, delivery_id=delivery, action=action, payload=payload)


def parse_git(headers: Mapping[str, str], body: bytes) -> ParsedDelivery:
    """Any forge: the first present event header (else a push when the body looks like one)."""
    payload = decode_body(headers, body)
    event = next((headers[h] for h in GIT_EVENT_HEADERS if headers.get(h)), None)
    if event is None:
        event = "push" if "ref" in payload and "after" in payload else "unknown"
    event = {"Push Hook": "push", "Tag Push Hook": "push", "Merge Request Hook": "pull_request"}.get(
        event, event
    )
    delivery = next((headers[h] for h in GIT_DELIVERY_HEADERS if headers.get(h)), None)
    if delivery is None:
        # No delivery id: an identical resend must dedup, so the body's hash is the id.
        delivery = "sha256:" + hashlib.sha256(body).hexdigest()
    action = payload.get("action") if isinstance(payload.get("action"), str) else None
    return ParsedDelivery(event=event, delivery_id=delivery, action=action, payload=payload)


def parse_generic(headers: Mapping[str, str], body: bytes, event_header: str | None) -> ParsedDelivery:
    """A non-git system's JSON; the action comes from the source's `event_header`."""
    payload = decode_body(headers, body)
    action = headers.get(event_header.lower()) if event_header else None
    delivery = next((headers[h] for h in ("x-delivery-id", *GIT_DELIVERY_HEADERS) if headers.get(h)), None)
    if delivery is None:
        delivery = "sha256:" + hashlib.sha256(body).hexdigest()
    return ParsedDelivery(event="generic", delivery_id=delivery, action=action, payload=payload)


def check_names(parsed: ParsedDelivery) -> ParsedDelivery:
    """Refuse an event name, action or delivery id longer than MAX_NAME_CHARS (never stored)."""
    for what, value in (
        ("event name", parsed.event),
        ("delivery id", parsed.delivery_id),
        ("action", parsed.action),
    ):
        if value is not None and len(value) > MAX_NAME_CHARS:
            raise InvalidRequest(f"the {what} is longer than {MAX_NAME_CHARS} characters")
    return parsed


def stored_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The allowlisted headers kept with a delivery."""
    return {k: v for k, v in headers.items() if k in STORED_HEADERS}


def changed_files_from_commits(payload: Mapping[str, Any]) -> list[str] | None:
    """Files added, modified or removed by a push payload's commits; None if it has no commit list."""
    commits = payload.get("commits")
    if not isinstance(commits, list):
        return None
    files: set[str] = set()
    for commit in commits:
        if not isinstance(commit, dict):
            continue
        for key in ("added", "modified", "removed"):
            for path in commit.get(key) or []:
                if isinstance(path, str):
                    files.add(path)
    return sorted(files)


def head_commit_message(payload: Mapping[str, Any]) -> str:
    """The pushed head commit's message ('' when the payload has none)."""
    head = payload.get("head_commit")
    if isinstance(head, dict) and isinstance(head.get("message"), str):
        return str(head["message"])
    commits = payload.get("commits")
    if isinstance(commits, list) and commits and isinstance(commits[-1], dict):
        return str(commits[-1].get("message") or "")
    return ""


def skip_ci_requested(message: str) -> bool:
    """`[skip ci]` or `[ci skip]` anywhere in the head commit message."""
    lowered = message.lower()
    return "[skip ci]" in lowered or "[ci skip]" in lowered
