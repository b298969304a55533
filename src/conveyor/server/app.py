"""App assembly: routes, error mapping, middleware, and the start-up/shut-down order."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import unquote

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from conveyor.admin.audit import ReadLogWriter
from conveyor.admin.auth import ADMIN_PREFIX, AdminGuard, verify_admin_routes
from conveyor.agents.hub import AGENT_HUB
from conveyor.cluster.drain import DRAIN
from conveyor.cluster.routes import PEER_HUB
from conveyor.cluster.snapshot import settings_check
from conveyor.cluster.startup import WORKER
from conveyor.dashboard import routes as dashboard_routes
from conveyor.dashboard.security import DashboardHeaders
from conveyor.dashboard.service import DashboardSessions
from conveyor.db.engine import check_reachable
from conveyor.db.migrate import status_on
from conveyor.http.inputs import InputGuard
from conveyor.model.errors import ApiError, clip_echoes, unavailable
from conveyor.model.ids import new_id
from conveyor.runtime.node import FatalStartupError
from conveyor.scaler.claim_route import CLAIM_PATH
from conveyor.scaler.claim_route import MAX_BODY_BYTES as MAX_CLAIM_BODY_BYTES
from conveyor.server.config import Settings
from conveyor.server.logs import log_context
from conveyor.server.metrics import Metrics
from conveyor.server.startup import prepare_database, redact_url
from conveyor.server.state import ServerState
from conveyor.server.wiring import (
    ADMIN_ROUTERS,
    APP_ROUTERS,
    STARTUP_HOOKS,
    WORKER_ROUTERS,
    WORKER_STARTUP_HOOKS,
)
from conveyor.version import COMMIT, VERSION

log = logging.getLogger(__name__)


_REQUEST_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_HTTP_CODES = {
    400: "invalid_request",
    401: "unauthenticated",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "payload_too_large",
    422: "invalid_body",
    429: "rate_limited",
    503: "unavailable",
}


def _validation_error(exc: RequestValidationError) -> ApiError:
    problems = []
    in_body = False
    for err in exc.errors():
        loc = [str(p) for p in err.get("loc", ())]
        if loc and loc[0] == "body":
            in_body = True
            loc = loc[1:]
        elif loc and loc[0] in ("query", "path", "header"):
            loc = loc[1:]
        name = ".".join(loc) or "body"
        message = err.get("msg", "invalid")
        if err.get("type") == "extra_forbidden":
            message = "is not a known field"
        elif err.get("type") == "literal_error" and "ctx" in err:
            message = "must be one of " + str(err["ctx"].get("expected", "")).replace("'", "").replace(
                " or ", ", "
            )
        problems.append(f"{name}: {message}")
    detail = "; ".join(problems) or "the request is not valid"
    return ApiError(422, "invalid_body", detail) if in_body else ApiError(400, "invalid_request", detail)


def _request_inputs(request: Request) -> list[str]:
    """What a caller sent outside the body: path segments and parameters, query values, headers."""
    inputs = [unquote(segment) for segment in request.url.path.split("/")]
    inputs += [str(v) for v in request.path_params.values()]
    inputs += [v for _, v in request.query_params.multi_items()]
    inputs += list(request.headers.values())
    return inputs


def _install_error_handlers(app: FastAPI) -> None:
    async def api_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        body = {"error": exc.code, "detail": clip_echoes(exc.detail, _request_inputs(request))}
        return JSONResponse(body, status_code=exc.status, headers=exc.headers)

    async def undecodable_body(request: Request, exc: Exception) -> Response:
        # json.loads gives up on a body nested deeper than the interpreter's recursion limit.
        log.info("refused a body nested too deeply on %s %s", request.method, request.url.path)
        error = ApiError(400, "invalid_request", "the body is not valid JSON: nested too deeply")
        return JSONResponse(error.body(), status_code=error.status)

    async def http_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        code = _HTTP_CODES.get(exc.status_code, "error")
        detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        if exc.status_code == 404 and detail == "Not Found":
            detail = "no such route"
        return JSONResponse({"error": code, "detail": detail}, status_code=exc.status_code)

    async def validation_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        error = _validation_error(exc)
        body = {"error": error.code, "detail": clip_echoes(error.detail, _request_inputs(request))}
        return JSONResponse(body, status_code=error.status)

    async def unexpected_error(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return JSONResponse({"error": "internal", "detail": "an internal error occurred"}, status_code=500)

    async def database_unavailable(request: Request, exc: Exception) -> Response:
        # A full pool, a lost connection or a locked SQLite file pass: the client retries, as it would
        # after a failed webhook commit, instead of reading a 500 as a bug.
        log.warning("database unavailable on %s %s: %s", request.method, request.url.path, exc)
        error = unavailable("the database is unavailable; retry later")
        return JSONResponse(error.body(), status_code=error.status, headers=error.headers)

    app.add_exception_handler(ApiError, api_error)
    for transient in (PoolTimeoutError, OperationalError, InterfaceError):
        app.add_exception_handler(transient, database_unavailable)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(RecursionError, undecodable_body)
    app.add_exception_handler(Exception, unexpected_error)


# A statement failed for a full disk this recently: `/ready` answers 503 (writes would answer 503 too).
DISK_FULL_NOT_READY_S = 10.0
# Browsers that reached the server over https keep to https for a year.
HSTS = b"max-age=31536000"


class RequestContext:
    """ASGI middleware: request id (honoured or generated, echoed), log context, HTTP metrics, and HSTS
    on answers over https."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"x-request-id"), None)
        request_id = given if given and _REQUEST_ID.match(given) else new_id()
        scope.setdefault("state", {})["request_id"] = request_id
        token = log_context.set({"request_id": request_id})
        status = [500]
        started = time.perf_counter()

        https = scope.get("scheme") == "https"

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                headers = [*message.get("headers", []), (b"x-request-id", request_id.encode())]
                if https:  # over TLS (directly, or as a trusted proxy's X-Forwarded-Proto says)
                    headers.append((b"strict-transport-security", HSTS))
                message["headers"] = headers
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            log_context.reset(token)
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            labels = (template, scope["method"], str(status[0]))
            self.metrics.http_requests.labels(*labels).inc()
            self.metrics.http_duration.labels(*labels).observe(time.perf_counter() - started)


def _draining(state: ServerState) -> bool:
    drain = state.parts.get(DRAIN)
    return drain is not None and drain.draining


def _worker_checks(state: ServerState) -> dict[str, dict[str, Any]]:
    hub = state.parts.get(PEER_HUB)
    connected = hub.connected() if hub else []
    wanted = len(hub.coordinator_urls) if hub else 0
    detail = f"{len(connected)} of {wanted} coordinators connected"
    if hub and hub.refusals:
        detail += "; refused: " + ", ".join(sorted(set(hub.refusals.values())))
    worker = state.parts.get(WORKER)
    agent_hub = state.parts.get(AGENT_HUB)
    held = len(worker.jobs) if worker is not None else 0
    agents = len(agent_hub.connections) if agent_hub is not None else 0
    pending = len(worker.outbox.pending()) if worker is not None else 0
    return {
        "coordinator": {"ok": bool(connected), "detail": detail},
        "settings": settings_check(state.parts),
        "jobs": {
            "ok": worker is not None,
            "detail": f"runs rerouted jobs: {held} held, {agents} agents connected, "
            f"{pending} results waiting in the outbox",
        },
    }


async def _readiness(state: ServerState) -> tuple[int, dict[str, Any]]:
    now = time.monotonic()
    cache_s = state.settings.ready_cache_ms / 1000
    if state.ready_cache and now - state.ready_cache[0] < cache_s:
        return state.ready_cache[1], state.ready_cache[2]
    if state.settings.cluster_role == "worker":
        worker_checks = _worker_checks(state)
        ready = all(c["ok"] for c in worker_checks.values())
        answer: dict[str, Any] = {"ready": ready, "draining": _draining(state), "checks": worker_checks}
        state.ready_cache = (now, 200 if ready else 503, answer)
        return state.ready_cache[1], answer
    checks: dict[str, dict[str, Any]] = {}
    began = time.perf_counter()
    try:
        await check_reachable(state.db, state.settings.ready_db_timeout_ms / 1000)
        checks["database"] = {"ok": True, "latency_ms": round((time.perf_counter() - began) * 1000, 1)}
    except Exception as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        checks["database"] = {
            "ok": False,
            "detail": f"database {redact_url(state.db.url)} is unreachable: {reason}"[:300],
        }
    if checks["database"]["ok"]:
        try:
            async with state.db.read() as conn:
                schema = await conn.run_sync(status_on)
            checks["migrations"] = {"ok": schema.state == "current", "detail": schema.describe()}
        except Exception as exc:
            checks["migrations"] = {"ok": False, "detail": f"could not read the schema revision: {exc}"[:300]}
    else:
        checks["migrations"] = {"ok": False, "detail": "database unreachable"}
    if state.db.disk_full_within(DISK_FULL_NOT_READY_S):
        checks["storage"] = {"ok": False, "detail": "writes are failing: the database's disk is full"}
    else:
        checks["storage"] = {"ok": True}
    started, detail = state.startup.readiness()
    checks["startup"] = {"ok": started, "detail": detail}
    ready = all(c["ok"] for c in checks.values())
    body: dict[str, Any] = {"ready": ready, "draining": _draining(state), "checks": checks}
    code = 200 if ready else 503
    state.ready_cache = (now, code, body)
    return code, body


def _add_probe_routes(app: FastAPI, state: ServerState) -> None:
    @app.get("/health", include_in_schema=False)
    async def health() -> dict[str, Any]:
        return {
            "status": "ok",
            "version": VERSION,
            "commit": COMMIT,
            "role": state.settings.cluster_role,
            "instance_id": state.instance_id,
            "uptime_s": round(time.monotonic() - state.started_monotonic, 3),
        }

    @app.get("/ready", include_in_schema=False)
    async def ready() -> Response:
        code, body = await _readiness(state)
        return JSONResponse(body, status_code=code)

    @app.get("/metrics", include_in_schema=False)
    async def metrics(request: Request) -> Response:
        expected = state.settings.metrics_token
        if expected and request.headers.get("authorization") != f"Bearer {expected}":
            return JSONResponse(
                {"error": "unauthenticated", "detail": "send Authorization: Bearer <metrics token>"},
                status_code=401,
            )
        return Response(state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")


async def _start_components(state: ServerState) -> None:
    hooks = WORKER_STARTUP_HOOKS if state.settings.cluster_role == "worker" else STARTUP_HOOKS
    try:
        for hook in hooks:
            started = await hook(state)
            state.components.extend(started)
    except FatalStartupError as exc:
        _fatal(state, str(exc))
        return
    except Exception as exc:
        if not state.startup.listen.is_set():
            raise  # still inside the lifespan's start-up: the server reports it and does not listen
        # The listener is open and nobody awaits this task: stop the node rather than serve half-started.
        log.exception("start-up failed after the listener opened")
        _fatal(state, f"start-up failed: {exc}")
        return
    state.startup.started, state.startup.waiting = True, None


def _fatal(state: ServerState, message: str) -> None:
    state.startup.fatal = message
    state.startup.done, state.startup.detail = False, message
    if state.fatal_exit:
        state.fatal_exit(message)


async def _start_before_listening(state: ServerState) -> asyncio.Task[None]:
    """Run the start-up hooks until they finish or one waits long (`StartupState.listen_while`).

    Returns the task running them: finished, or still running behind the open listener.
    """
    task = asyncio.create_task(_start_components(state), name="startup")
    listen = asyncio.create_task(state.startup.listen.wait(), name="startup-listen")
    try:
        await asyncio.wait({task, listen}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        raise
    finally:
        listen.cancel()
    if task.done():
        task.result()  # what a hook raised, raised here as when the hooks ran inline
    else:
        log.info("listening while start-up waits: %s", state.startup.waiting)
    return task


async def _startup_loop(state: ServerState) -> None:
    """Retry preparing the database until it works (or a fatal condition stops the node)."""
    while not state.startup.done:
        try:
            await prepare_database(
                state.db,
                migrate=not state.settings.no_migrate,
                public_url=public_url(state.settings),
                state=state.startup,
                timeout_s=state.settings.ready_db_timeout_ms / 1000,
            )
        except FatalStartupError as exc:
            state.startup.fatal = str(exc)
            if state.fatal_exit:
                state.fatal_exit(str(exc))
            return
        except Exception as exc:
            state.startup.detail = f"waiting for the database: {exc}"[:300]
            log.warning("database not ready: %s", exc)
            await asyncio.sleep(state.settings.startup_retry_ms / 1000)
            continue
        if not state.startup.done:  # e.g. a refused migration: report and keep serving probes
            return
    await _start_components(state)


def public_url(settings: Settings) -> str:
    """The URL clients use to reach this node."""
    if settings.public_url:
        return settings.public_url
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "::", "") else settings.host
    return f"http://{host}:{settings.port}"


def create_app(state: ServerState, *, extra_admin_routers: Sequence[APIRouter] = ()) -> FastAPI:
    """Assemble the app; refuses (RoutePermissionError) when an admin route lacks exactly one permission."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state.read_log = ReadLogWriter(
            state.db,
            flush_interval_s=state.settings.access_log_flush_ms / 1000,
            on_drop=lambda n: state.metrics.access_log_dropped.inc(n),
        )
        state.read_log.start()
        if state.startup.done:
            startup_task = await _start_before_listening(state)
        else:
            state.startup.listen.set()  # the listener opens now; start-up goes on behind it
            startup_task = asyncio.create_task(_startup_loop(state), name="startup")
        try:
            yield
        finally:
            if not startup_task.done():
                startup_task.cancel()
                # Waited for, so no component is started after the loop below has stopped them all.
                await asyncio.gather(startup_task, return_exceptions=True)
            for component in reversed(state.components):
                try:
                    await component.stop()
                except Exception:
                    log.exception("error stopping %s", type(component).__name__)
            await state.read_log.stop()
            await state.db.dispose()

    app = FastAPI(
        title="Conveyor",
        version=VERSION,
        openapi_url="/api/v1/openapi.json",
        docs_url=None,
        redoc_url=None,
        lifespan=lifespan,
    )
    app.state.db = state.db
    app.state.server = state
    app.state.metrics = state.metrics
    _install_error_handlers(app)
    _add_probe_routes(app, state)
    if state.settings.cluster_role == "worker":
        for router in WORKER_ROUTERS:
            app.include_router(router)
        app.add_middleware(InputGuard)
        app.add_middleware(RequestContext, metrics=state.metrics)
        return app
    routers = (*ADMIN_ROUTERS, *extra_admin_routers)
    admin_table = verify_admin_routes(routers)
    # The routes outside the admin API first: a request is matched against routes in order, and the
    # webhook route, the hottest, would otherwise be tried after every admin route.
    for router in APP_ROUTERS:
        app.include_router(router)
    for router in routers:
        app.include_router(router, prefix=ADMIN_PREFIX)
    dashboard = DashboardSessions(
        state.db,
        idle_ms=state.settings.dashboard_session_idle_ms,
        max_failures=state.settings.dashboard_sign_in_max_failures,
        window_ms=state.settings.dashboard_sign_in_window_ms,
    )
    app.state.dashboard = dashboard
    dashboard_routes.install(app)
    # Inside the admin guard (a middleware added earlier runs later): an admin request is authenticated
    # before its body is read. Every other route's body is bounded here before anything reads it.
    app.add_middleware(InputGuard, body_limits={CLAIM_PATH: MAX_CLAIM_BODY_BYTES})
    app.add_middleware(
        AdminGuard,
        routes=admin_table,
        get_db=lambda: state.db,
        read_log=lambda: state.read_log,
        on_auth_failure=lambda reason: state.metrics.admin_auth_failures.labels(reason).inc(),
        session_lookup=lambda: dashboard.principal_for_cookie_header,
    )
    app.add_middleware(DashboardHeaders)
    app.add_middleware(RequestContext, metrics=state.metrics)
    return app
