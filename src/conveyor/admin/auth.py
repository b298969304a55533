"""Admin authentication and authorisation.

Every admin route declares exactly one permission with `Depends(require("perm"))`. The guard
middleware checks the bearer token, the permission and the token's scope *before* FastAPI reads
the body, so a caller without the right never learns about fields; the dependency then hands the
authenticated `Principal` to the handler.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from fastapi import APIRouter
from fastapi.routing import APIRoute
from starlette.routing import compile_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from conveyor.admin.audit import ReadLogWriter, write_in_change
from conveyor.admin.store import find_token_by_hash, insert_access_rows
from conveyor.admin.tokens import hash_token, looks_like_admin_token, malformed_token_detail
from conveyor.db.engine import Database
from conveyor.errors import ConveyorError
from conveyor.http.deps import AccessEntry, AccessLogWrite, PermissionSpec, Principal
from conveyor.http.inputs import answer
from conveyor.model.errors import ApiError
from conveyor.model.ids import utc_now
from conveyor.model.permissions import role_allows

log = logging.getLogger(__name__)

ADMIN_PREFIX = "/api/v1/admin"
TOUCH_INTERVAL = timedelta(minutes=1)
ANONYMOUS_LOG_INTERVAL_S = 60.0
# Scope-state key of the principal the dashboard calls the API as (set in process only, never by a client).
DASHBOARD_PRINCIPAL = "dashboard_principal"
SESSION_COOKIE = "conveyor_session"

SessionLookup = Callable[[str | None], Awaitable[Principal | None]]


class RoutePermissionError(ConveyorError, RuntimeError):
    """An admin route declares no permission, or more than one: the server refuses to start."""


def _permission_specs(route: APIRoute) -> list[PermissionSpec]:
    found: list[PermissionSpec] = []

    def walk(dependant: Any) -> None:
        spec = getattr(dependant.call, "conveyor_permission", None)
        if isinstance(spec, PermissionSpec):
            found.append(spec)
        for sub in dependant.dependencies:
            walk(sub)

    walk(route.dependant)
    return found


@dataclass(frozen=True)
class AdminRoute:
    """One admin route as the guard sees it: where it is, what it needs, what it is called."""

    path: str
    methods: frozenset[str]
    pattern: re.Pattern[str]
    spec: PermissionSpec
    action: str


def verify_admin_routes(routers: Sequence[APIRouter]) -> list[AdminRoute]:
    """Check every admin route names exactly one permission; record it in the OpenAPI extensions.

    Raises `RoutePermissionError` (the server refuses to start) naming each offending route.
    """
    table: list[AdminRoute] = []
    problems: list[str] = []
    for router in routers:
        for route in router.routes:
            if not isinstance(route, APIRoute):
                problems.append(f"{getattr(route, 'path', route)} is not an API route")
                continue
            path = ADMIN_PREFIX + route.path
            found = _permission_specs(route)
            methods = frozenset(route.methods or ())
            if len(found) != 1:
                listed = ",".join(sorted(methods))
                problems.append(f"{listed} {path} declares {len(found)} permissions (needs exactly one)")
                continue
            route.openapi_extra = {
                **(route.openapi_extra or {}),
                "x-conveyor-permission": found[0].permission,
                "x-conveyor-scoped": found[0].scoped,
            }
            pattern, _, _ = compile_path(path)
            table.append(AdminRoute(path, methods, pattern, found[0], route.operation_id or route.name))
    if problems:
        raise RoutePermissionError("; ".join(problems))
    return table


def client_source(headers: dict[str, str]) -> str:
    """`cli`, `dashboard` or `http`, from the caller's headers (docs/design/admin.md §5)."""
    if headers.get("user-agent", "").startswith("conveyor-cli/"):
        return "cli"
    if headers.get("x-conveyor-client", "") == "dashboard":
        return "dashboard"
    return "http"


def _uses_session(headers: dict[str, str], method: str) -> bool:
    """Whether a request authenticates with a dashboard session cookie (reads without a bearer token)."""
    return (
        "authorization" not in headers
        and method in ("GET", "HEAD")
        and SESSION_COOKIE in headers.get("cookie", "")
    )


class AdminGuard:
    """ASGI middleware: authentication, permission and scope for admin routes."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        routes: Sequence[AdminRoute],
        get_db: Callable[[], Database | None],
        read_log: Callable[[], ReadLogWriter | None],
        on_auth_failure: Callable[[str], None],
        session_lookup: Callable[[], SessionLookup | None] = lambda: None,
    ) -> None:
        self.app = app
        self._session_lookup = session_lookup
        self._routes = list(routes)
        self._get_db = get_db
        self._read_log = read_log
        self._on_auth_failure = on_auth_failure
        self._anonymous_logged: dict[str, float] = {}

    def _route_for(self, path: str, method: str) -> AdminRoute | None:
        partial: AdminRoute | None = None
        for route in self._routes:
            if route.pattern.match(path):
                if method in route.methods or (method == "HEAD" and "GET" in route.methods):
                    return route
                partial = partial or route
        return partial

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(ADMIN_PREFIX):
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        state = scope.setdefault("state", {})
        request_id = state.get("request_id")
        remote = scope["client"][0] if scope.get("client") else None
        method = scope["method"]
        # The body is neither read nor bounded here: `conveyor.http.inputs.InputGuard`, inside this guard,
        # bounds it once the caller is known.
        route = self._route_for(scope["path"], method)
        if route is None:  # no such route: FastAPI answers 404
            await self.app(scope, receive, send)
            return
        spec, action = route.spec, route.action

        try:
            internal = state.get(DASHBOARD_PRINCIPAL)
            if isinstance(internal, Principal):
                principal, source = internal, "dashboard"
            else:
                principal, source = await self._authenticate(headers, method)
        except ApiError as error:
            reason = {"unauthenticated": "missing", "invalid_token": "invalid"}.get(error.code, "unavailable")
            self._on_auth_failure(reason)
            if error.status == 401:
                await self._log_anonymous(action, spec, error, request_id, remote, headers)
            await answer(send, error)
            return

        entry = AccessEntry(
            action=action,
            outcome="allowed",
            status_code=200,
            source=source,
            actor_id=principal.token_id,
            actor_label=principal.label,
            actor_role=principal.role,
            permission=spec.permission,
            routing_key=principal.routing_key,
            request_id=request_id,
            remote_addr=remote,
        )
        denial: ApiError | None = None
        if not role_allows(principal.role, spec.permission):
            denial = ApiError(
                403,
                "forbidden",
                f"this route needs {spec.permission}; role {principal.role} does not have it",
            )
            self._on_auth_failure("forbidden")
        elif principal.scoped and not spec.scoped:
            denial = ApiError(
                403,
                "token_scope",
                f"a token scoped to {principal.routing_key} cannot call this org-wide route",
            )
            self._on_auth_failure("scope")
        if denial is not None:
            entry.outcome, entry.status_code, entry.error = "denied", 403, denial.detail
            await answer(send, denial)
            await self._write_now(entry)
            return

        state["principal"] = principal
        state["access_entry"] = entry
        write: AccessLogWrite = write_in_change
        state["access_log_write"] = write
        if not isinstance(internal, Principal):
            state["authorisation_check"] = self._recheck(headers, from_session=_uses_session(headers, method))
        status_holder: list[int] = [500]

        async def send_wrapper(message: Message) -> None:
            if message["type"] == "http.response.start":
                status_holder[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            await self._after(principal, entry, method, status_holder[0], state)

    async def _authenticate(self, headers: dict[str, str], method: str) -> tuple[Principal, str]:
        """The caller and the access log's `source`: a bearer token, or a dashboard session on a read."""
        if _uses_session(headers, method):
            # Reads only (the log stream, live status): a write from a browser goes through /ui and its CSRF check.
            lookup = self._session_lookup()
            if lookup is not None:
                try:
                    principal = await lookup(headers.get("cookie"))
                except Exception as exc:
                    log.warning("dashboard session lookup failed: %s", exc)
                    raise ApiError(
                        503, "auth_unavailable", "the session could not be checked; try again"
                    ) from exc
                if principal is None:
                    raise ApiError(401, "invalid_token", "the session is unknown, signed out or expired")
                return principal, "dashboard"
        return await self._bearer(headers), client_source(headers)

    def _recheck(self, headers: dict[str, str], *, from_session: bool) -> Callable[[], Awaitable[bool]]:
        """A re-check of this caller, for responses that outlive the request (log streams).

        False once the token is revoked or expired (or the dashboard session ended); a check that
        cannot reach the database answers True, so a blip does not cut streams a later check keeps.
        """

        async def still_authorised() -> bool:
            try:
                lookup = self._session_lookup() if from_session else None
                if lookup is not None:
                    return await lookup(headers.get("cookie")) is not None
                await self._bearer(headers)
            except ApiError as error:
                return error.status >= 500
            except Exception as exc:
                log.warning("re-checking a caller's token failed: %s", exc)
            return True

        return still_authorised

    async def _bearer(self, headers: dict[str, str]) -> Principal:
        value = headers.get("authorization", "")
        scheme, _, token = value.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise ApiError(401, "unauthenticated", "send Authorization: Bearer <admin token>")
        token = token.strip()
        if not looks_like_admin_token(token):
            raise ApiError(401, "unauthenticated", malformed_token_detail(token))
        db = self._get_db()
        if db is None:
            raise ApiError(503, "auth_unavailable", "the database is not available; try again")
        try:
            async with db.read() as conn:
                row = await find_token_by_hash(conn, hash_token(token))
        except Exception as exc:
            log.warning("admin token lookup failed: %s", exc)
            raise ApiError(503, "auth_unavailable", "the token could not be checked; try again") from exc
        now = utc_now()
        if row is None or not row.is_live(now):
            raise ApiError(401, "invalid_token", "the token is unknown, revoked or expired")
        if row.last_used_at is None or now - row.last_used_at >= TOUCH_INTERVAL:
            writer = self._read_log()
            if writer is not None:
                writer.note_token_use(row.id, now)
        return Principal(token_id=row.id, label=row.label, role=row.role, routing_key=row.routing_key)

    async def _after(
        self, principal: Principal, entry: AccessEntry, method: str, status: int, state: dict[str, Any]
    ) -> None:
        entry.status_code = status
        if method in ("GET", "HEAD"):
            writer = self._read_log()
            if writer is not None:
                entry.outcome = "allowed" if status < 400 else "error"
                writer.offer(entry)
            return
        if state.get("access_logged") and status < 500:
            return  # the handler wrote it in the change's own transaction, which committed
        entry.outcome = "denied" if status == 403 else ("allowed" if status < 400 else "error")
        await self._write_now(entry)

    async def _log_anonymous(
        self,
        action: str,
        spec: PermissionSpec,
        error: ApiError,
        request_id: str | None,
        remote: str | None,
        headers: dict[str, str],
    ) -> None:
        key = remote or "unknown"
        now = time.monotonic()
        if now - self._anonymous_logged.get(key, -ANONYMOUS_LOG_INTERVAL_S) < ANONYMOUS_LOG_INTERVAL_S:
            return
        self._anonymous_logged[key] = now
        await self._write_now(
            AccessEntry(
                action=action,
                outcome="denied",
                status_code=error.status,
                source=client_source(headers),
                actor_type="anonymous",
                permission=spec.permission,
                request_id=request_id,
                remote_addr=remote,
                error=error.detail,
            )
        )

    async def _write_now(self, entry: AccessEntry) -> None:
        db = self._get_db()
        if db is None:
            return
        try:
            async with db.transaction() as conn:
                await insert_access_rows(conn, [entry.as_row()])
        except Exception as exc:
            log.warning("could not write access-log row for %s: %s", entry.action, exc)
