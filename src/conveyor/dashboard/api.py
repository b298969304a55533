"""In-process calls into the admin API on behalf of a signed-in session.

The dashboard never reads the domain tables: every page asks the admin API, through the same
middleware, guard, permission table, scope rules and access log as `conveyor admin`. The signed-in
principal rides in the ASGI scope's state (which no client can set), and the call is marked
`X-Conveyor-Client: dashboard` so the access log records `source=dashboard`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from fastapi import Request
from starlette.types import Message

from conveyor.admin.auth import ADMIN_PREFIX, DASHBOARD_PRINCIPAL
from conveyor.http.deps import Principal


@dataclass(frozen=True)
class ApiAnswer:
    """Status and decoded JSON body of one admin call."""

    status: int
    body: Any

    @property
    def ok(self) -> bool:
        """2xx."""
        return 200 <= self.status < 300

    @property
    def detail(self) -> str:
        """The API's error sentence, for a flash message."""
        if isinstance(self.body, dict):
            return str(self.body.get("detail") or self.body.get("error") or self.status)
        return str(self.status)


async def call_api(
    request: Request,
    principal: Principal,
    method: str,
    path: str,
    *,
    query: dict[str, Any] | None = None,
    body: Any = None,
) -> ApiAnswer:
    """`method ADMIN_PREFIX+path` through the whole app, as `principal`."""
    params = {k: v for k, v in (query or {}).items() if v not in (None, "")}
    payload = b"" if body is None else json.dumps(body).encode()
    headers = [
        (b"x-conveyor-client", b"dashboard"),
        (b"accept", b"application/json"),
        (b"content-length", str(len(payload)).encode()),
    ]
    if body is not None:
        headers.append((b"content-type", b"application/json"))
    request_id = getattr(request.state, "request_id", None)
    if request_id:
        headers.append((b"x-request-id", str(request_id).encode()))
    full_path = ADMIN_PREFIX + path
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": request.url.scheme,
        "path": full_path,
        "raw_path": full_path.encode(),
        "root_path": "",
        "query_string": urlencode(params, doseq=True).encode(),
        "headers": headers,
        "client": request.scope.get("client"),
        "server": request.scope.get("server"),
        "state": {DASHBOARD_PRINCIPAL: principal},
    }
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": payload, "more_body": False}

    status = 500
    chunks: list[bytes] = []

    async def send(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await request.app(scope, receive, send)
    raw = b"".join(chunks)
    try:
        decoded = json.loads(raw) if raw else None
    except ValueError:
        decoded = {"error": "internal", "detail": raw[:200].decode("utf-8", "replace")}
    return ApiAnswer(status, decoded)
