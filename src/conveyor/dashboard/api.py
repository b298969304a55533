"""In-process calls into the admin API on behalf of a signed-in session.

The dashboard never reads the domain tables: every page asks the admin API, through the same
middleware, guard, permission table, scope rules and access log as `conveyor admin`. The signed-in
principal rides in the ASGI scope's state (which no client can set), and the call is marked
`X-Conveyor-Client: dashboard` so the access log records `source=dashboard`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from fastapi import Request, Response
from starlette.types import Message, Receive, Scope, Send

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


def _api_scope(
    request: Request,
    principal: Principal,
    method: str,
    path: str,
    *,
    query: dict[str, Any] | None = None,
    headers: list[tuple[bytes, bytes]] | None = None,
) -> Scope:
    """The ASGI scope of an in-process admin call made as `principal` (carried in the scope's state,
    which no client can set) and marked as the dashboard's."""
    params = {k: v for k, v in (query or {}).items() if v not in (None, "")}
    all_headers = [(b"x-conveyor-client", b"dashboard"), *(headers or [])]
    request_id = getattr(request.state, "request_id", None)
    if request_id:
        all_headers.append((b"x-request-id", str(request_id).encode()))
    full_path = ADMIN_PREFIX + path
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": request.url.scheme,
        "path": full_path,
        "raw_path": full_path.encode(),
        "root_path": "",
        "query_string": urlencode(params, doseq=True).encode(),
        "headers": all_headers,
        "client": request.scope.get("client"),
        "server": request.scope.get("server"),
        "state": {DASHBOARD_PRINCIPAL: principal},
    }


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
    payload = b"" if body is None else json.dumps(body).encode()
    headers = [(b"accept", b"application/json"), (b"content-length", str(len(payload)).encode())]
    if body is not None:
        headers.append((b"content-type", b"application/json"))
    scope = _api_scope(request, principal, method, path, query=query, headers=headers)
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
    return ApiAnswer(status, _decoded(b"".join(chunks)))


def _decoded(raw: bytes) -> Any:
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return {"error": "internal", "detail": raw[:200].decode("utf-8", "replace")}


class ApiStream(Response):
    """A GET of the admin API relayed to the browser as it is produced (an artifact's bytes, which are
    never held in memory), as `principal`: the same guard, permission check and access log as
    `call_api`. An error answer is handed to `on_error`, whose page is sent instead of the JSON.
    """

    def __init__(
        self,
        request: Request,
        principal: Principal,
        path: str,
        on_error: Callable[[ApiAnswer], Response],
        *,
        forward: tuple[str, ...] = ("range",),
    ) -> None:
        super().__init__()
        headers = [
            (name.encode(), value.encode("latin-1"))
            for name in forward
            if (value := request.headers.get(name)) is not None
        ]
        self._scope = _api_scope(request, principal, "GET", path, headers=headers)
        self._app = request.app
        self._on_error = on_error

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        failed: list[int] = []
        chunks: list[bytes] = []

        async def relay(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] >= 400:
                failed.append(message["status"])
            if not failed:
                await send(message)
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        # The browser's own `receive`: the inner answer sees its disconnect and stops streaming.
        await self._app(self._scope, receive, relay)
        if failed:
            await self._on_error(ApiAnswer(failed[0], _decoded(b"".join(chunks))))(scope, receive, send)
