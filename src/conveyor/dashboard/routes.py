"""The dashboard's pages under `/ui` (server-rendered; reads and actions go through the admin API)."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.datastructures import FormData

from conveyor.dashboard.api import ApiAnswer, ApiStream, call_api
from conveyor.dashboard.forms import (
    agent_token_body,
    filled,
    input_fields,
    inputs_from_form,
    notification_rule_body,
)
from conveyor.dashboard.graph import NODE_HEIGHT, NODE_WIDTH, layout_job_graph
from conveyor.dashboard.logview import StepLogView, is_setup_step, step_log_view
from conveyor.dashboard.service import DashboardSessions, Session, SignInRefused
from conveyor.dashboard.sessions import COOKIE_NAME, CSRF_FIELD, csrf_matches, origin_allowed
from conveyor.dashboard.views import (
    TERMINAL_RUN_STATUSES,
    can_rerun_failed,
    exact_time,
    jobs_in_needs_order,
    open_step_index,
    relative_time,
    safe_next,
    visible_agents,
)
from conveyor.events.models import OUTCOMES, STATES
from conveyor.matching.trace_text import run_trace_lines
from conveyor.model.caches import step_cache_text
from conveyor.model.durations import duration_text
from conveyor.model.ids import utc_now
from conveyor.model.permissions import role_allows
from conveyor.model.sizes import size_text

log = logging.getLogger(__name__)

router = APIRouter(prefix="/ui", include_in_schema=False)
STATIC_DIR = Path(__file__).parent / "static"

_env = Environment(
    loader=PackageLoader("conveyor.dashboard", "templates"),
    autoescape=select_autoescape(default=True, default_for_string=True),
    trim_blocks=True,
    lstrip_blocks=True,
)
_env.globals["duration"] = duration_text
_env.globals["can_rerun_failed"] = can_rerun_failed
_env.filters["size"] = size_text
_env.filters["ago"] = lambda value: relative_time(value, utc_now())
_env.filters["exact_time"] = exact_time
_env.filters["step_cache"] = step_cache_text
_env.filters["urlquote"] = lambda value: quote(str(value), safe="")
# Plain JSON text; autoescaping makes it safe in HTML (`tojson` would show quotes as \u0027).
_env.filters["pretty"] = lambda value, indent=2: json.dumps(
    value, indent=indent or None, ensure_ascii=False, default=str, sort_keys=True
)

LOG_PREVIEW_BYTES = 256 * 1024
RUN_STATUSES = ("queued", "running", "success", "failed", "cancelled")
DELIVERY_STATUSES = ("received", "processed", "failed")


def _sessions(request: Request) -> DashboardSessions:
    service: DashboardSessions = request.app.state.dashboard
    return service


def _remote(request: Request) -> str:
    return request.client.host if request.client else "unknown"


async def _session(request: Request) -> Session | None:
    return await _sessions(request).resolve(request.cookies.get(COOKIE_NAME))


def _to_sign_in(request: Request) -> RedirectResponse:
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    response = RedirectResponse("/ui/sign-in?" + urlencode({"next": target}), status_code=303)
    response.delete_cookie(COOKIE_NAME, path="/")
    return response


def _render(
    request: Request, template: str, session: Session | None, *, status: int = 200, **context: Any
) -> HTMLResponse:
    principal = session.principal if session else None

    def can(permission: str) -> bool:
        return principal is not None and role_allows(principal.role, permission)

    html = _env.get_template(template).render(
        request=request,
        principal=principal,
        csrf_token=session.csrf_token if session else "",
        csrf_field=CSRF_FIELD,
        can=can,
        path=request.url.path,
        notice=request.query_params.get("notice"),
        **context,
    )
    return HTMLResponse(html, status_code=status)


def _error_page(request: Request, session: Session | None, answer: ApiAnswer) -> HTMLResponse:
    return _render(request, "error.html", session, status=answer.status, answer=answer)


def _query(request: Request, names: tuple[str, ...]) -> dict[str, str]:
    return {n: request.query_params[n] for n in names if request.query_params.get(n)}


def _page_link(request: Request, cursor: str | None, names: tuple[str, ...]) -> str | None:
    if not cursor:
        return None
    return request.url.path + "?" + urlencode({**_query(request, names), "cursor": cursor})


def _same_origin(request: Request) -> bool:
    return origin_allowed(request.headers.get("origin"), f"{request.url.scheme}://{request.url.netloc}")


async def _checked_form(request: Request, session: Session) -> FormData | None:
    """The posted form when its CSRF value matches the session's and the Origin (if sent) is ours."""
    if not _same_origin(request):
        return None
    form = await request.form()
    given = form.get(CSRF_FIELD)
    return form if csrf_matches(session.csrf_token, given if isinstance(given, str) else None) else None


def _csrf_refused(request: Request, session: Session) -> HTMLResponse:
    answer = ApiAnswer(
        403, {"error": "csrf", "detail": "the form is stale or came from another site; reload"}
    )
    return _error_page(request, session, answer)


async def _posted(request: Request) -> tuple[Session, FormData] | Response:
    """The session and its CSRF-checked form, or the answer refusing the post (sign in again, or 403)."""
    session = await _session(request)
    if session is None:
        return _to_sign_in(request)
    form = await _checked_form(request, session)
    if form is None:
        return _csrf_refused(request, session)
    return session, form


async def _list_page(
    request: Request,
    api_path: str,
    filter_names: tuple[str, ...],
    template: str,
    *,
    api_names: Mapping[str, str | None] | None = None,
    fixed_query: Mapping[str, str] | None = None,
    limit: int | None = None,
    **extra: Any,
) -> Response:
    """A filtered, keyset-paginated list: the page's filters go to the API (renamed by `api_names`,
    `None` for a page-only one), with `fixed_query` added."""
    session = await _session(request)
    if session is None:
        return _to_sign_in(request)
    filters = _query(request, filter_names)
    names = api_names or {}
    query: dict[str, Any] = {}
    for name, value in filters.items():
        api_name = names.get(name, name)
        if api_name is not None:
            query[api_name] = value
    query.update(fixed_query or {})
    query.update(cursor=request.query_params.get("cursor"), limit=limit)
    answer = await call_api(request, session.principal, "GET", api_path, query=query)
    if not answer.ok:
        return _error_page(request, session, answer)
    return _render(
        request,
        template,
        session,
        items=answer.body["items"],
        filters=filters,
        next_page=_page_link(request, answer.body.get("next_cursor"), filter_names),
        **extra,
    )


def _back(path: str, notice: str) -> RedirectResponse:
    return RedirectResponse(f"{path}?{urlencode({'notice': notice})}", status_code=303)


# -- sign-in -----------------------------------------------------------------------------------------


@router.get("/sign-in")
async def sign_in_page(request: Request) -> Response:
    """The one unauthenticated page: paste an admin token."""
    return _render(request, "sign_in.html", None, next=safe_next(request.query_params.get("next")))


@router.post("/sign-in")
async def sign_in(request: Request) -> Response:
    """Exchange a pasted token for a session cookie; failures are throttled per address and counted.

    A post from another site is refused before the token is looked at (login CSRF: a foreign page
    would otherwise sign this browser in to a session of the attacker's choosing).
    """
    if not _same_origin(request):
        answer = ApiAnswer(403, {"error": "csrf", "detail": "a sign-in posted from another site is refused"})
        return _error_page(request, None, answer)
    service = _sessions(request)
    remote = _remote(request)
    form = await request.form()
    target = safe_next(str(form.get("next") or ""))
    wait = service.retry_after(remote)
    if wait is not None:
        request.app.state.metrics.admin_auth_failures.labels("throttled").inc()
        response = _render(
            request,
            "sign_in.html",
            None,
            status=429,
            next=target,
            error=f"too many failed attempts; try again in {int(wait) + 1} s",
        )
        response.headers["Retry-After"] = str(int(wait) + 1)
        return response
    token = form.get("token")
    try:
        cookie, _ = await service.sign_in(token if isinstance(token, str) else "", remote)
    except SignInRefused as refused:
        service.failed(remote)
        request.app.state.metrics.admin_auth_failures.labels("invalid").inc()
        log.info("dashboard sign-in refused from %s", remote)
        return _render(request, "sign_in.html", None, status=401, next=target, error=str(refused))
    service.succeeded(remote)
    signed_in = RedirectResponse(target, status_code=303)
    signed_in.set_cookie(
        COOKIE_NAME,
        cookie,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path="/",
    )
    return signed_in


@router.post("/sign-out")
async def sign_out(request: Request) -> Response:
    """End this browser's session."""
    session = await _session(request)
    if session is None:
        return _to_sign_in(request)
    if await _checked_form(request, session) is None:
        return _csrf_refused(request, session)
    await _sessions(request).end(session.id)
    response = RedirectResponse("/ui/sign-in", status_code=303)
    response.delete_cookie(COOKIE_NAME, path="/")
    return response


@router.get("")
@router.get("/")
async def home() -> Response:
    """The runs page is the start page."""
    return RedirectResponse("/ui/runs", status_code=303)


# -- runs --------------------------------------------------------------------------------------------

_RUN_FILTERS = ("workflow", "status", "source", "ref")


@router.get("/runs")
async def runs_page(request: Request) -> Response:
    """Runs, newest first, filterable; active rows update live."""
    return await _list_page(
        request,
        "/runs",
        _RUN_FILTERS,
        "runs.html",
        api_names={"source": "routing_key"},
        limit=50,
        statuses=RUN_STATUSES,
        terminal=TERMINAL_RUN_STATUSES,
    )


@router.get("/runs/{run_id}")
async def run_page(run_id: str, request: Request) -> Response:
    """One run: jobs in `needs` order, steps, logs (live while running), actions, and why it ran."""
    session = await _session(request)
    if session is None:
        return _to_sign_in(request)
    answer = await call_api(request, session.principal, "GET", f"/runs/{quote(run_id, safe='')}")
    if not answer.ok:
        return _error_page(request, session, answer)
    run = answer.body
    jobs = jobs_in_needs_order(run.pop("jobs", []))
    logs: dict[str, dict[int, StepLogView]] = {}
    can_read_logs = role_allows(session.principal.role, "log.read")
    for job in jobs:
        job["open_step"] = open_step_index(job)
        for step in job.get("steps") or []:
            step["setup"] = is_setup_step(step)
        if can_read_logs and job.get("status") in TERMINAL_RUN_STATUSES:
            logs[job["id"]] = await _step_logs(request, session, run_id, job)
    run_path = f"/runs/{quote(run_id, safe='')}"
    # What the run made: artifacts (artifact.read, which an operator lacks) and JUnit summaries (run.read).
    artifacts = None
    if role_allows(session.principal.role, "artifact.read"):
        artifacts = await call_api(request, session.principal, "GET", run_path + "/artifacts")
    reports = await call_api(request, session.principal, "GET", run_path + "/test-reports")
    trace = run.pop("trigger_trace", None)
    return _render(
        request,
        "run.html",
        session,
        run=run,
        jobs=jobs,
        logs=logs,
        graph=layout_job_graph(jobs),
        node_width=NODE_WIDTH,
        node_height=NODE_HEIGHT,
        trace=trace,
        trace_lines=run_trace_lines(trace) if isinstance(trace, dict) else None,
        terminal=TERMINAL_RUN_STATUSES,
        artifacts=artifacts.body["items"] if artifacts is not None and artifacts.ok else None,
        artifacts_error=artifacts.detail if artifacts is not None and not artifacts.ok else None,
        reports=reports.body["items"] if reports.ok else None,
        reports_error=None if reports.ok else reports.detail,
    )


async def _step_logs(
    request: Request, session: Session, run_id: str, job: dict[str, Any]
) -> dict[int, StepLogView]:
    """Every started step's log (its first LOG_PREVIEW_BYTES), with the lines' times, so the page can
    search the whole job and open any step; a running job's log comes from the stream instead."""
    views: dict[int, StepLogView] = {}
    path = f"/runs/{quote(run_id, safe='')}/jobs/{quote(job['id'], safe='')}/logs"
    for step in job.get("steps") or []:
        if step.get("status") in (None, "pending"):
            continue
        index = int(step["step_index"])
        query = {"step": index, "limit_bytes": LOG_PREVIEW_BYTES, "timestamps": "true"}
        answer = await call_api(request, session.principal, "GET", path, query=query)
        if answer.ok:
            views[index] = step_log_view(
                answer.body.get("text", ""),
                answer.body.get("times"),
                setup=is_setup_step(step),
                complete=bool(answer.body.get("complete")),
            )
    return views


@router.get("/runs/{run_id}/jobs/{job_id}/log")
async def job_log_download(run_id: str, job_id: str, request: Request) -> Response:
    """The job's whole log as a text file, relayed from the admin API as the signed-in session (log.read)."""
    session = await _session(request)
    if session is None:
        return _to_sign_in(request)
    path = f"/runs/{quote(run_id, safe='')}/jobs/{quote(job_id, safe='')}/logs/raw"
    return ApiStream(
        request, session.principal, path, lambda answer: _error_page(request, session, answer), forward=()
    )


@router.get("/runs/{run_id}/artifacts/{name}")
async def artifact_download(run_id: str, name: str, request: Request) -> Response:
    """An artifact's bytes, streamed from the admin API as the signed-in session (artifact.read)."""
    session = await _session(request)
    if session is None:
        return _to_sign_in(request)
    path = f"/runs/{quote(run_id, safe='')}/artifacts/{quote(name, safe='')}/content"
    return ApiStream(request, session.principal, path, lambda answer: _error_page(request, session, answer))


@router.post("/runs/{run_id}/cancel")
async def cancel_run(run_id: str, request: Request) -> Response:
    """Cancel a run (run.cancel); the notice names the run."""
    path = f"/runs/{quote(run_id, safe='')}"

    async def notice(session: Session, answer: ApiAnswer) -> str:
        shown = await call_api(request, session.principal, "GET", path)
        name = f"run #{shown.body['number']}" if shown.ok else f"run {run_id}"
        return f"{name} cancelled" + _cancel_detail(answer.body)

    return await _post_action(request, path + "/cancel", {}, f"/ui/runs/{run_id}", notice=notice)


def _cancel_detail(body: Any) -> str:
    if not isinstance(body, dict):
        return ""
    parts = []
    if body.get("cancelled"):
        parts.append(f"{body['cancelled']} job(s) at once")
    if body.get("signalled"):
        parts.append(f"{body['signalled']} running job(s) signalled")
    return f" ({', '.join(parts)})" if parts else ""


@router.post("/runs/{run_id}/jobs/{job_id}/decide")
async def decide_job(run_id: str, job_id: str, request: Request) -> Response:
    """Approve or reject a job waiting for its protected environment (run.approve,
    docs/design/approvals.md §3), with the form's comment."""
    posted = await _posted(request)
    if isinstance(posted, Response):
        return posted
    session, form = posted
    verb = "reject" if form.get("decision") == "reject" else "approve"
    comment = str(form.get("comment") or "").strip()
    answer = await call_api(
        request,
        session.principal,
        "POST",
        f"/runs/{quote(run_id, safe='')}/jobs/{quote(job_id, safe='')}/{verb}",
        body={"comment": comment} if comment else {},
    )
    if not answer.ok:
        return _error_page(request, session, answer)
    return _back(f"/ui/runs/{run_id}", "approved" if verb == "approve" else "rejected")


@router.post("/runs/{run_id}/rerun")
async def rerun(run_id: str, request: Request) -> Response:
    """Re-run a run, or only its failed jobs (run.rerun); opens the new run."""
    posted = await _posted(request)
    if isinstance(posted, Response):
        return posted
    session, form = posted
    failed_only = form.get("failed_only") == "true"
    answer = await call_api(
        request,
        session.principal,
        "POST",
        f"/runs/{quote(run_id, safe='')}/rerun",
        body={"failed_only": failed_only},
    )
    if not answer.ok:
        return _error_page(request, session, answer)
    what = "a re-run of its failed jobs" if failed_only else "a re-run"
    return _back(f"/ui/runs/{answer.body['id']}", f"run #{answer.body['number']} started: {what}")


async def _post_action(
    request: Request,
    api_path: str,
    body: Any,
    back_to: str,
    *,
    method: str = "POST",
    notice: str | Callable[[Session, ApiAnswer], Awaitable[str]],
) -> Response:
    """A form's action through the API; back to `back_to` with a notice saying what happened."""
    posted = await _posted(request)
    if isinstance(posted, Response):
        return posted
    session, _ = posted
    answer = await call_api(request, session.principal, method, api_path, body=body)
    if not answer.ok:
        return _error_page(request, session, answer)
    return _back(back_to, notice if isinstance(notice, str) else await notice(session, answer))


# -- deliveries and events ---------------------------------------------------------------------------

_DELIVERY_FILTERS = ("status", "source")


@router.get("/deliveries")
async def deliveries_page(request: Request) -> Response:
    """Webhook deliveries, newest first."""
    return await _list_page(
        request, "/deliveries", _DELIVERY_FILTERS, "deliveries.html", statuses=DELIVERY_STATUSES
    )


@router.get("/deliveries/{delivery_id}")
async def delivery_page(delivery_id: str, request: Request) -> Response:
    """One delivery: its match outcome and the runs it started."""
    return await _detail(request, f"/deliveries/{quote(delivery_id, safe='')}", "delivery.html", "delivery")


@router.get("/deliveries/{delivery_id}/payload")
async def delivery_payload(delivery_id: str, request: Request) -> Response:
    """A delivery's payload, redacted; refused without event.read_payload."""
    return await _payload(
        request, f"/deliveries/{quote(delivery_id, safe='')}/payload", f"delivery {delivery_id}"
    )


@router.post("/deliveries/{delivery_id}/replay")
async def replay_delivery(delivery_id: str, request: Request) -> Response:
    """Replay a failed delivery (event_dlq.manage)."""
    path = f"/deliveries/{quote(delivery_id, safe='')}"
    return await _post_action(
        request, path + "/replay", None, f"/ui{path}", notice=f"delivery {delivery_id} replayed"
    )


_EVENT_FILTERS = ("name", "outcome", "state", "internal")


@router.get("/events")
async def events_page(request: Request) -> Response:
    """Internal events, newest first; Conveyor's own names only when asked (`?internal=1` or by name)."""
    show_internal = bool(request.query_params.get("internal") or request.query_params.get("name"))
    return await _list_page(
        request,
        "/events",
        _EVENT_FILTERS,
        "events.html",
        api_names={"internal": None},
        fixed_query=None if show_internal else {"internal": "false"},
        outcomes=OUTCOMES,
        states=STATES,
    )


@router.get("/events/{event_id}")
async def event_page(event_id: str, request: Request) -> Response:
    """One event: state, attempts, how it was matched and the runs it started."""
    session = await _session(request)
    if session is None:
        return _to_sign_in(request)
    answer = await call_api(request, session.principal, "GET", f"/events/{quote(event_id, safe='')}")
    if not answer.ok:
        return _error_page(request, session, answer)
    return _render(request, "event.html", session, event=answer.body["event"], runs=answer.body["runs"])


@router.get("/events/{event_id}/payload")
async def event_payload(event_id: str, request: Request) -> Response:
    """An event's payload, redacted; refused without event.read_payload."""
    return await _payload(request, f"/events/{quote(event_id, safe='')}/payload", f"event {event_id}")


async def _detail(request: Request, api_path: str, template: str, name: str) -> Response:
    session = await _session(request)
    if session is None:
        return _to_sign_in(request)
    answer = await call_api(request, session.principal, "GET", api_path)
    if not answer.ok:
        return _error_page(request, session, answer)
    return _render(request, template, session, **{name: answer.body})


async def _payload(request: Request, api_path: str, title: str) -> Response:
    session = await _session(request)
    if session is None:
        return _to_sign_in(request)
    answer = await call_api(request, session.principal, "GET", api_path)
    if not answer.ok:
        return _error_page(request, session, answer)
    return _render(request, "payload.html", session, title=title, payload=answer.body.get("payload"))


# -- dead letters ------------------------------------------------------------------------------------


@router.get("/dlq")
async def dlq_page(request: Request) -> Response:
    """Dead-lettered events with retry and discard (for roles that may)."""
    return await _list_page(request, "/event-dlq", (), "dlq.html")


@router.post("/dlq/{event_id}/retry")
async def dlq_retry(event_id: str, request: Request) -> Response:
    """Retry a dead letter (event_dlq.manage)."""
    return await _post_action(
        request,
        f"/event-dlq/{quote(event_id, safe='')}/retry",
        None,
        "/ui/dlq",
        notice=f"event {event_id} queued for retry",
    )


@router.post("/dlq/{event_id}/discard")
async def dlq_discard(event_id: str, request: Request) -> Response:
    """Discard a dead letter (event_dlq.manage)."""
    return await _post_action(
        request,
        f"/event-dlq/{quote(event_id, safe='')}",
        None,
        "/ui/dlq",
        method="DELETE",
        notice=f"event {event_id} discarded",
    )


# -- sources, workflows, "Run workflow" -----------------------------------------------------------------


@router.get("/sources")
async def sources_page(request: Request) -> Response:
    """Sources: kind, routing key, default branch; each links to its workflows."""
    return await _list_page(request, "/sources", (), "sources.html")


@router.get("/sources/{source_id}")
async def source_page(source_id: str, request: Request) -> Response:
    """One source and the workflows of its lock at the default branch (or `?ref=`)."""
    session = await _session(request)
    if session is None:
        return _to_sign_in(request)
    path = f"/sources/{quote(source_id, safe='')}"
    source = await call_api(request, session.principal, "GET", path)
    if not source.ok:
        return _error_page(request, session, source)
    ref = request.query_params.get("ref") or None
    workflows = await call_api(request, session.principal, "GET", path + "/workflows", query={"ref": ref})
    return _render(
        request,
        "source.html",
        session,
        source=source.body,
        ref=ref,
        workflows=workflows.body if workflows.ok else None,
        workflows_error=None if workflows.ok else workflows.detail,
    )


# The source page's switches: the form's `setting` names one `PATCH sources/{id}` field and `value` its new state.
SOURCE_SWITCHES = ("enabled", "public_badges")


@router.post("/sources/{source_id}/switch")
async def switch_source(source_id: str, request: Request) -> Response:
    """Turn a source's `enabled` or `public_badges` on or off (source.manage)."""
    posted = await _posted(request)
    if isinstance(posted, Response):
        return posted
    session, form = posted
    setting, on = str(form.get("setting") or ""), form.get("value") == "true"
    if setting not in SOURCE_SWITCHES:
        return _error_page(
            request, session, ApiAnswer(400, {"error": "invalid_request", "detail": f"no switch {setting!r}"})
        )
    path = f"/sources/{quote(source_id, safe='')}"
    answer = await call_api(request, session.principal, "PATCH", path, body={setting: on})
    if not answer.ok:
        return _error_page(request, session, answer)
    return _back(
        f"/ui{path}", f"source {answer.body['name']}: {setting.replace('_', ' ')} {'on' if on else 'off'}"
    )


@router.post("/sources/{source_id}/remove")
async def remove_source(source_id: str, request: Request) -> Response:
    """Remove a source and its secrets (source.manage)."""
    return await _post_action(
        request,
        f"/sources/{quote(source_id, safe='')}",
        None,
        "/ui/sources",
        method="DELETE",
        notice=f"source {source_id} removed",
    )


@router.get("/sources/{source_id}/workflows/{workflow}")
async def workflow_page(source_id: str, workflow: str, request: Request) -> Response:
    """A workflow of a source: its recent runs and, for a `dispatch` trigger, the "Run workflow" form."""
    session = await _session(request)
    if session is None:
        return _to_sign_in(request)
    return await _workflow_page(request, session, source_id, workflow, request.query_params.get("ref"))


async def _workflow_page(
    request: Request,
    session: Session,
    source_id: str,
    workflow: str,
    ref: str | None,
    *,
    refused: ApiAnswer | None = None,
    posted: Mapping[str, Any] | None = None,
) -> Response:
    """The workflow page; after a refused run, with the API's error (and its status) and the values
    posted, so nothing typed is lost."""
    path = f"/sources/{quote(source_id, safe='')}/workflows"
    listing = await call_api(request, session.principal, "GET", path, query={"ref": ref or None})
    if not listing.ok:
        return _error_page(request, session, refused or listing)
    entry = next((w for w in listing.body["workflows"] if w["name"] == workflow), None)
    if entry is None:
        missing = ApiAnswer(
            404,
            {
                "error": "not_found",
                "detail": f"the lock of {listing.body['name']} at {listing.body['ref']} has no workflow {workflow}",
            },
        )
        return _error_page(request, session, refused or missing)
    runs = await call_api(
        request,
        session.principal,
        "GET",
        "/runs",
        query={"workflow": workflow, "routing_key": listing.body.get("routing_key"), "limit": 10},
    )
    dispatch = entry.get("dispatch")
    return _render(
        request,
        "workflow.html",
        session,
        status=refused.status if refused is not None else 200,
        listing=listing.body,
        workflow=entry,
        fields=input_fields(dispatch["inputs"], posted) if dispatch else None,
        ref=ref or listing.body["ref"],
        refused=refused.detail if refused is not None else None,
        runs=runs.body["items"] if runs.ok else None,
    )


@router.post("/sources/{source_id}/workflows/{workflow}/run")
async def run_workflow(source_id: str, workflow: str, request: Request) -> Response:
    """Start a run through the workflow's `dispatch` trigger (`POST runs`, source.trigger) with the
    form's inputs; a refusal shows the workflow page again with the API's error, and starts nothing."""
    posted = await _posted(request)
    if isinstance(posted, Response):
        return posted
    session, form = posted
    ref = str(form.get("ref") or "").strip() or None
    body = {"source": source_id, "workflow": workflow, "ref": ref, "inputs": inputs_from_form(form)}
    answer = await call_api(
        request, session.principal, "POST", "/runs", body={k: v for k, v in body.items() if v is not None}
    )
    if answer.status in (400, 422):
        return await _workflow_page(request, session, source_id, workflow, ref, refused=answer, posted=form)
    if not answer.ok:
        return _error_page(request, session, answer)
    return _back(f"/ui/runs/{answer.body['id']}", f"run #{answer.body['number']} started: {workflow} by hand")


# -- secrets -----------------------------------------------------------------------------------------


@router.get("/secrets")
async def secrets_page(request: Request) -> Response:
    """Secret names, scopes and versions (never values); set and delete for roles with secret.write."""
    return await _list_page(request, "/secrets", ("scope",), "secrets.html", limit=100)


def _secret_path(scope: str, name: str) -> str:
    return f"/secrets/{quote(scope, safe='/:')}/{quote(name, safe='')}"


@router.post("/secrets/set")
async def set_secret(request: Request) -> Response:
    """Create or replace a secret (secret.write). The value goes to the API and nowhere else: not into
    the notice, a redirect or an error page."""
    posted = await _posted(request)
    if isinstance(posted, Response):
        return posted
    session, form = posted
    scope = str(form.get("scope") or "org").strip()
    name = str(form.get("name") or "").strip()
    value = form.get("value")
    answer = await call_api(
        request,
        session.principal,
        "PUT",
        _secret_path(scope, name),
        body={"value": value if isinstance(value, str) else ""},
    )
    if not answer.ok:
        return _error_page(request, session, answer)
    verb = "created" if answer.status == 201 else "replaced"
    return _back("/ui/secrets", f"secret {name} {verb} in scope {scope}")


@router.post("/secrets/delete")
async def delete_secret(request: Request) -> Response:
    """Delete a secret (secret.write)."""
    posted = await _posted(request)
    if isinstance(posted, Response):
        return posted
    session, form = posted
    scope, name = str(form.get("scope") or ""), str(form.get("name") or "")
    answer = await call_api(request, session.principal, "DELETE", _secret_path(scope, name))
    if not answer.ok:
        return _error_page(request, session, answer)
    return _back("/ui/secrets", f"secret {name} deleted from scope {scope}")


# -- tokens ------------------------------------------------------------------------------------------


@router.get("/tokens")
async def tokens_page(request: Request) -> Response:
    """Admin tokens (token.manage, owners only) and agent tokens (agent.read): metadata and prefixes, never
    a hash; create (the plaintext shown once) and revoke for roles that may."""
    session = await _session(request)
    if session is None:
        return _to_sign_in(request)
    admin = None
    if role_allows(session.principal.role, "token.manage"):
        admin = await call_api(request, session.principal, "GET", "/tokens")
    agent = await call_api(request, session.principal, "GET", "/agent-tokens", query={"limit": 500})
    return _render(
        request,
        "tokens.html",
        session,
        admin_tokens=admin.body["items"] if admin is not None and admin.ok else None,
        agent_tokens=agent.body["items"] if agent.ok else None,
        agent_tokens_error=None if agent.ok else agent.detail,
        roles=("owner", "admin", "operator", "auditor"),
    )


async def _create_token(
    request: Request, api_path: str, body_of: Callable[[FormData], Any], kind: str
) -> Response:
    """Mint a token through the API and show its plaintext on this one answer (never in a redirect)."""
    posted = await _posted(request)
    if isinstance(posted, Response):
        return posted
    session, form = posted
    answer = await call_api(request, session.principal, "POST", api_path, body=body_of(form))
    if not answer.ok:
        return _error_page(request, session, answer)
    return _render(request, "token_created.html", session, status=201, created=answer.body, kind=kind)


@router.post("/tokens/create")
async def create_admin_token(request: Request) -> Response:
    """Create an admin token (token.manage)."""
    return await _create_token(
        request,
        "/tokens",
        lambda form: filled(form, ("label", "role", "routing_key", "expires_in_days")),
        "admin",
    )


@router.post("/tokens/{token_id}/revoke")
async def revoke_admin_token(token_id: str, request: Request) -> Response:
    """Revoke an admin token (token.manage); its sessions end at their next request."""
    return await _post_action(
        request,
        f"/tokens/{quote(token_id, safe='')}",
        None,
        "/ui/tokens",
        method="DELETE",
        notice=f"admin token {token_id} revoked",
    )


@router.post("/agent-tokens/create")
async def create_agent_token(request: Request) -> Response:
    """Create a static agent token (agent.manage)."""
    return await _create_token(request, "/agent-tokens", agent_token_body, "agent")


@router.post("/agent-tokens/{token_id}/revoke")
async def revoke_agent_token(token_id: str, request: Request) -> Response:
    """Revoke an agent token (agent.manage); its connected agents are closed."""
    return await _post_action(
        request,
        f"/agent-tokens/{quote(token_id, safe='')}",
        None,
        "/ui/tokens",
        method="DELETE",
        notice=f"agent token {token_id} revoked",
    )


# -- notification rules ------------------------------------------------------------------------------

NOTIFY_ON = ("failed", "fixed", "succeeded", "approval_requested")


@router.get("/notifications")
async def notifications_page(request: Request) -> Response:
    """Notification rules (source.read; a webhook shown by scheme and host); add and remove (source.manage)."""
    return await _list_page(request, "/notification-rules", (), "notifications.html", notify_on=NOTIFY_ON)


@router.post("/notifications/create")
async def create_notification_rule(request: Request) -> Response:
    """Add a rule (source.manage)."""
    posted = await _posted(request)
    if isinstance(posted, Response):
        return posted
    session, form = posted
    on = [str(value) for value in form.getlist("on")]
    answer = await call_api(
        request, session.principal, "POST", "/notification-rules", body=notification_rule_body(form, on)
    )
    if not answer.ok:
        return _error_page(request, session, answer)
    return _back("/ui/notifications", f"notification rule {answer.body['id']} added")


@router.post("/notifications/{rule_id}/remove")
async def remove_notification_rule(rule_id: str, request: Request) -> Response:
    """Remove a rule (source.manage)."""
    return await _post_action(
        request,
        f"/notification-rules/{quote(rule_id, safe='')}",
        None,
        "/ui/notifications",
        method="DELETE",
        notice=f"notification rule {rule_id} removed",
    )


# -- agents, scalers, cluster ------------------------------------------------------------------------


@router.get("/agents")
async def agents_page(request: Request) -> Response:
    """Agents (labels, capacity, current jobs), scalers (capacity, backoff) and orphans."""
    session = await _session(request)
    if session is None:
        return _to_sign_in(request)
    agents = await call_api(request, session.principal, "GET", "/agents", query={"limit": 500})
    if not agents.ok:
        return _error_page(request, session, agents)
    show_gone = bool(request.query_params.get("gone"))
    gone_ms = request.app.state.server.settings.dashboard_agent_gone_ms
    shown, hidden = visible_agents(agents.body["items"], utc_now(), gone_ms, show_gone=show_gone)
    scalers = await call_api(request, session.principal, "GET", "/scaler/status")
    orphans = await call_api(request, session.principal, "GET", "/scaler/orphans")
    return _render(
        request,
        "agents.html",
        session,
        agents=shown,
        hidden_agents=hidden,
        show_gone=show_gone,
        gone_after=f"{gone_ms // 60_000} min" if gone_ms >= 60_000 else f"{gone_ms // 1000} s",
        scalers=scalers.body if scalers.ok else None,
        scalers_error=None if scalers.ok else scalers.detail,
        orphans=orphans.body if orphans.ok else None,
        orphans_error=None if orphans.ok else orphans.detail,
    )


@router.post("/scalers/reload")
async def reload_scalers(request: Request) -> Response:
    """Re-read the scalers' configuration (scaler.manage); all of it applies or none."""
    return await _post_action(
        request, "/scaler/reload", None, "/ui/agents", notice="scaler configuration reloaded"
    )


@router.get("/cluster")
async def cluster_page(request: Request) -> Response:
    """Instances, the leader, peers (workers and coordinators on the peer channel), settings propagation."""
    session = await _session(request)
    if session is None:
        return _to_sign_in(request)
    status = await call_api(request, session.principal, "GET", "/cluster/status")
    if not status.ok:
        return _error_page(request, session, status)
    propagation = await call_api(request, session.principal, "GET", "/cluster-settings/propagation")
    peers = await call_api(request, session.principal, "GET", "/peers")
    return _render(
        request,
        "cluster.html",
        session,
        cluster=status.body,
        propagation=propagation.body if propagation.ok else None,
        propagation_error=None if propagation.ok else propagation.detail,
        peers=peers.body["items"] if peers.ok else None,
        peers_error=None if peers.ok else peers.detail,
        now=datetime.now(),
    )


# Last of the router: any other page under /ui is the dashboard's own 404 page, not the API's JSON.
@router.get("/{unknown:path}")
async def unknown_page(unknown: str, request: Request) -> Response:
    """An HTML 404 for a dashboard address that names no page."""
    session = await _session(request)
    answer = ApiAnswer(404, {"error": "not_found", "detail": f"there is no dashboard page /ui/{unknown}"})
    return _error_page(request, session, answer)


def install(app: FastAPI) -> None:
    """Serve the packaged static files, the pages, and `/` as a redirect to the dashboard.

    The static mount goes first: the pages end in a catch-all 404 that would otherwise answer for it.
    """
    app.mount("/ui/static", StaticFiles(directory=STATIC_DIR), name="dashboard-static")
    app.include_router(router)

    @app.get("/", include_in_schema=False)
    async def root() -> Response:
        return RedirectResponse("/ui/", status_code=307)
