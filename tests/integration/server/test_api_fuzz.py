"""Fuzzing a real server on PostgreSQL: the admin API (schemathesis from its own `/openapi.json`, with the
owner token) and every webhook route (a schema of the forge and generic payloads, signed where the source
verifies): no answer may be a server error (5xx).

The number of examples is bounded so that the whole module takes a minute or two on a quiet machine. A
failure names the request (a curl command for the admin API, the headers and body for a webhook).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.config import SchemathesisConfig

from tests.support import postgres
from tests.support.http import HTTP
from tests.support.processes import ServerProcess
from tests.support.repos import make_repo

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("api-fuzz"), pytest.mark.timeout(600)]

ADMIN_EXAMPLES = 8
WEBHOOK_EXAMPLES = 80
WEBHOOK_SECRET = "fuzz-webhook-secret"
FUZZ_SETTINGS = {
    "deadline": None,
    "suppress_health_check": list(HealthCheck),
    "database": None,
    "derandomize": False,
}


@dataclass
class FuzzTarget:
    """The server under fuzz and the sources its webhook routes answer for."""

    server: ServerProcess
    token: str
    # source id -> (kind, verify) of every source made, plus one id that names no source
    sources: dict[str, tuple[str, str]]

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


def _add_source(server: ServerProcess, token: str, body: dict[str, Any]) -> str:
    answer = HTTP.post(
        f"{server.url}/api/v1/admin/sources",
        json=body,
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )
    assert answer.status_code == 201, answer.text
    return str(answer.json()["id"])


@pytest.fixture(scope="module")
def fuzz_target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FuzzTarget]:
    """One server on a fresh PostgreSQL database, with a source of every kind and verification."""
    postgres.check_reachable()
    name = postgres.new_database_name("fuzz_")
    url = postgres.create_database(name)
    home = tmp_path_factory.mktemp("fuzz")
    repo = make_repo(home / "repo")
    # Forge API calls (lock reads, statuses) go to a closed loopback port: they fail at once.
    server = ServerProcess(home / "home", database_url=url, env={"CONVEYOR_EVENTS_POLL_SECONDS": "0.5"})
    try:
        server.wait_ready()
        token = server.owner_token()
        closed_api = "http://127.0.0.1:9"
        bodies: list[tuple[dict[str, Any], str]] = [
            (
                {
                    "kind": "github",
                    "name": "acme/app",
                    "repo": "acme/app",
                    "api_url": closed_api,
                    "webhook_secret": WEBHOOK_SECRET,
                },
                "hmac",
            ),
            (
                {
                    "kind": "github",
                    "name": "acme-org",
                    "repo": "acme/*",
                    "api_url": closed_api,
                    "webhook_secret": WEBHOOK_SECRET,
                },
                "hmac",
            ),
            ({"kind": "git", "name": "git-open", "clone_url": f"file://{repo}", "verify": "none"}, "none"),
            (
                {
                    "kind": "git",
                    "name": "git-hmac",
                    "clone_url": f"file://{repo}",
                    "verify": "hmac",
                    "webhook_secret": WEBHOOK_SECRET,
                },
                "hmac",
            ),
            (
                {
                    "kind": "git",
                    "name": "git-token",
                    "clone_url": f"file://{repo}",
                    "verify": "token",
                    "signature_header": "X-Gitlab-Token",
                    "webhook_secret": WEBHOOK_SECRET,
                },
                "token",
            ),
            (
                {"kind": "generic", "name": "generic-open", "verify": "none", "event_header": "X-Event"},
                "none",
            ),
            (
                {
                    "kind": "generic",
                    "name": "generic-hmac",
                    "verify": "hmac",
                    "webhook_secret": WEBHOOK_SECRET,
                },
                "hmac",
            ),
            ({"kind": "local", "name": "local", "path": str(repo)}, "none"),
        ]
        sources = {_add_source(server, token, body): (body["kind"], verify) for body, verify in bodies}
        sources["no-such-source"] = ("none", "none")
        yield FuzzTarget(server, token, sources)
    finally:
        server.stop()
        postgres.drop_database(name)


def _config() -> SchemathesisConfig:
    return SchemathesisConfig.from_dict({"generation": {"max-examples": ADMIN_EXAMPLES}})


@pytest.fixture(scope="module")
def admin_schema(fuzz_target: FuzzTarget) -> Any:
    """The admin API's own OpenAPI document, as the server serves it."""
    return schemathesis.openapi.from_url(f"{fuzz_target.server.url}/api/v1/openapi.json", config=_config())


admin = schemathesis.pytest.from_fixture("admin_schema")


def _server_error(response: Any, case: Any) -> str:
    return (
        f"{response.status_code} from {case.method} {case.formatted_path}: {response.text[:500]}\n"
        f"{case.as_curl_command()}"
    )


@admin.parametrize()
@settings(max_examples=ADMIN_EXAMPLES, **FUZZ_SETTINGS)  # type: ignore[arg-type]
def test_the_admin_api_answers_no_server_error(case: Any, fuzz_target: FuzzTarget) -> None:
    response = case.call(base_url=fuzz_target.server.url, headers=fuzz_target.auth, timeout=30)
    assert response.status_code < 500, _server_error(response, case)


# --- webhooks

PUSH_LIKE = {
    "type": "object",
    "properties": {
        "ref": {"type": "string"},
        "before": {"type": "string"},
        "after": {"type": "string"},
        "checkout_sha": {"type": "string"},
        "deleted": {"type": "boolean"},
        "repository": {
            "type": "object",
            "properties": {
                "full_name": {"type": "string"},
                "clone_url": {"type": "string"},
                "default_branch": {"type": "string"},
            },
        },
        "sender": {"type": "object", "properties": {"login": {"type": "string"}}},
        "head_commit": {"type": "object", "properties": {"message": {"type": "string"}}},
        "commits": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "id": {"type": "string"},
                    "message": {"type": "string"},
                    "added": {"type": "array", "items": {"type": "string"}},
                    "modified": {"type": "array", "items": {"type": "string"}},
                    "removed": {"type": "array", "items": {"type": "string"}},
                },
            },
        },
        "action": {"type": "string"},
        "number": {"type": "integer"},
        "pull_request": {
            "type": "object",
            "properties": {
                "number": {"type": "integer"},
                "head": {
                    "type": "object",
                    "properties": {
                        "ref": {"type": "string"},
                        "sha": {"type": "string"},
                        "repo": {"type": "object", "properties": {"full_name": {"type": "string"}}},
                    },
                },
                "base": {"type": "object", "properties": {"ref": {"type": "string"}}},
            },
        },
        "object_attributes": {
            "type": "object",
            "properties": {
                "iid": {"type": "integer"},
                "target_branch": {"type": "string"},
                "source_branch": {"type": "string"},
                "last_commit": {"type": "object", "properties": {"id": {"type": "string"}}},
            },
        },
    },
}
EVENT_NAMES = [
    "push",
    "pull_request",
    "ping",
    "create",
    "delete",
    "release",
    "Push Hook",
    "Merge Request Hook",
]


def _header(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "in": "header", "required": False, "schema": schema}


def webhook_document(source_ids: list[str]) -> dict[str, Any]:
    """An OpenAPI document of `POST /webhooks/{source_id}` for these sources."""
    event = {"anyOf": [{"enum": EVENT_NAMES}, {"type": "string"}]}
    return {
        "openapi": "3.0.3",
        "info": {"title": "Conveyor webhooks", "version": "1"},
        "paths": {
            "/webhooks/{source_id}": {
                "post": {
                    "parameters": [
                        {
                            "name": "source_id",
                            "in": "path",
                            "required": True,
                            "schema": {"anyOf": [{"enum": source_ids}, {"type": "string"}]},
                        },
                        _header("X-GitHub-Event", event),
                        _header("X-GitHub-Delivery", {"type": "string"}),
                        _header("X-Gitlab-Event", event),
                        _header("X-Gitea-Delivery", {"type": "string"}),
                        _header("X-Delivery-Id", {"type": "string"}),
                        _header("X-Event", {"type": "string"}),
                    ],
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {"schema": PUSH_LIKE},
                            "application/x-www-form-urlencoded": {
                                "schema": {
                                    "type": "object",
                                    "properties": {"payload": {"type": "string"}},
                                }
                            },
                        },
                    },
                    "responses": {"default": {"description": "any"}},
                }
            }
        },
    }


@pytest.fixture(scope="module")
def webhook_schema(fuzz_target: FuzzTarget) -> Any:
    """The webhook route of every source kind and verification."""
    config = SchemathesisConfig.from_dict({"generation": {"max-examples": WEBHOOK_EXAMPLES}})
    return schemathesis.openapi.from_dict(webhook_document(sorted(fuzz_target.sources)), config=config)


webhooks = schemathesis.pytest.from_fixture("webhook_schema")


def signed(request: dict[str, Any], kind: str, verify: str) -> dict[str, Any]:
    """The request as the source's sender would sign it (an unsigned one only reaches the 401)."""
    headers = dict(request.get("headers") or {})
    if "json" in request:
        body = json.dumps(request.pop("json")).encode()
        headers.setdefault("Content-Type", "application/json")
    else:
        data = request.pop("data", b"")
        if isinstance(data, dict):
            body = urlencode(
                {str(k): v if isinstance(v, str) else json.dumps(v) for k, v in data.items()}
            ).encode()
        elif isinstance(data, str | bytes):
            body = data.encode() if isinstance(data, str) else data
        else:
            body = json.dumps(data).encode()
    if verify == "hmac":
        digest = hmac.new(WEBHOOK_SECRET.encode(), body, hashlib.sha256).hexdigest()
        headers["X-Hub-Signature-256"] = f"sha256={digest}"
    elif verify == "token":
        headers["X-Gitlab-Token"] = WEBHOOK_SECRET
    return {**request, "headers": headers, "content": body}


@webhooks.parametrize()
@settings(max_examples=WEBHOOK_EXAMPLES, **FUZZ_SETTINGS)  # type: ignore[arg-type]
def test_every_webhook_route_answers_no_server_error(case: Any, fuzz_target: FuzzTarget) -> None:
    kind, verify = fuzz_target.sources.get(case.path_parameters.get("source_id"), ("none", "none"))
    request = signed(case.as_transport_kwargs(base_url=fuzz_target.server.url), kind, verify)
    response = HTTP.request(
        request["method"],
        request["url"],
        headers=request["headers"],
        params=request.get("params"),
        content=request["content"],
        timeout=30,
    )
    assert response.status_code < 500, (
        f"{response.status_code} from POST {request['url']} ({kind}, verify {verify}): {response.text[:500]}\n"
        f"headers {request['headers']}\nbody {request['content'][:2000]!r}"
    )
