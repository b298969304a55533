"""ASGI middleware: what any HTTP request may send, checked before a route reads it.

- Every body is bounded while it is read: a declared `Content-Length` over the route's limit is refused
  at once, and a body sent without one is refused as soon as it passes the limit, so a 300 MiB body to an
  unauthenticated route is never held in memory (413 `payload_too_large`).
- A NUL character in the path, the query string, a JSON body or a form body is refused (400
  `invalid_request`), and so is NaN or Infinity in a JSON body: PostgreSQL stores neither, and a route
  would otherwise fail in its statement.

Webhook routes (`/webhooks/…`) read and check their own bodies, with the configurable webhook limit, and so
do artifact uploads (`/api/v1/uploads/…`, with `artifact_max_bytes`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from urllib.parse import unquote_to_bytes

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from conveyor.errors import ConveyorError
from conveyor.model.errors import ApiError
from conveyor.model.storable import NUL, json_body_problem

MAX_BODY_BYTES = 1024 * 1024
# Artifact uploads stream their bodies into the blob store under `artifact_max_bytes`
# (docs/design/artifacts.md §4).
SELF_CHECKING_PREFIXES = ("/webhooks/", "/api/v1/uploads/")
_NO_BODY_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


class BodyTooLarge(ConveyorError):
    """The body passed its limit while it was read."""


def request_line_problem(path: str, query_string: bytes) -> str | None:
    """Why a request's path or query string cannot be served, or None."""
    if NUL in path:
        return "the path holds a NUL character (%00), which cannot be stored"
    if b"\x00" in query_string or b"\x00" in unquote_to_bytes(query_string):
        return "the query string holds a NUL character (%00), which cannot be stored"
    return None


def body_problem(content_type: str, body: bytes) -> str | None:
    """Why a request body cannot be stored, or None. JSON is the default, as FastAPI reads a body
    without a content type as JSON."""
    media_type = content_type.split(";", 1)[0].strip().lower()
    if media_type == "application/x-www-form-urlencoded":
        if b"\x00" in body or b"\x00" in unquote_to_bytes(body.replace(b"+", b" ")):
            return "the form holds a NUL character (%00), which cannot be stored"
        return None
    if not media_type or media_type == "application/json" or media_type.endswith("+json"):
        return json_body_problem(body)
    return None


class InputGuard:
    """Bounds every body while it is read and refuses what the databases cannot store."""

    def __init__(self, app: ASGIApp, *, body_limits: Mapping[str, int] | None = None) -> None:
        self.app = app
        self._limits = dict(body_limits or {})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        problem = request_line_problem(scope["path"], scope.get("query_string", b""))
        if problem is not None:
            await answer(send, ApiError(400, "invalid_request", problem))
            return
        if scope["path"].startswith(SELF_CHECKING_PREFIXES):
            await self.app(scope, receive, send)
            return
        limit = self._limits.get(scope["path"], MAX_BODY_BYTES)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        declared = headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await answer(send, too_large(limit))
            return
        if scope["method"] in _NO_BODY_METHODS:
            await self.app(scope, limited(receive, limit), send)
            return
        try:
            body = await read_body(receive, limit)
        except BodyTooLarge:
            await answer(send, too_large(limit))
            return
        problem = body_problem(headers.get("content-type", ""), body)
        if problem is not None:
            await answer(send, ApiError(400, "invalid_request", problem))
            return
        await self.app(scope, replay(body, receive), send)


def too_large(limit: int) -> ApiError:
    """The 413 for a body over `limit` bytes."""
    size = f"{limit // (1024 * 1024)} MiB" if limit % (1024 * 1024) == 0 else f"{limit} bytes"
    return ApiError(413, "payload_too_large", f"the request body is larger than {size}")


async def read_body(receive: Receive, limit: int) -> bytes:
    """The whole body, raising `BodyTooLarge` as soon as it passes `limit` (nothing more is read)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":  # the client went away: the route finds out itself
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that hands the app the body already read, then waits on the real one (a disconnect)."""
    sent = False

    async def wrapped() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return wrapped


def limited(receive: Receive, limit: int) -> Receive:
    """A `receive` that stops a body once it passes `limit` (FastAPI turns the 413 into the error body)."""
    seen = 0

    async def wrapped() -> Message:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                raise HTTPException(413, too_large(limit).detail)
        return message

    return wrapped


async def answer(send: Send, error: ApiError) -> None:
    """Send `error` as the JSON answer."""
    body = json.dumps(error.body()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in error.headers.items()]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
