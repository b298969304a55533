"""The dashboard's pages under `/ui` (server-rendered; reads and actions go through the admin API)."""

from __future__ import annotations

import logging
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import RedirectResponse, Response
from fastapi.staticfiles import StaticFiles

from conveyor.dashboard.api import ApiAnswer, ApiStream, call_api
from conveyor.dashboard.graph import NODE_HEIGHT, NODE_WIDTH, layout_job_graph
from conveyor.dashboard.logview import StepLogView, is_setup_step, step_log_view
from conveyor.dashboard.manage import router as manage_router
from conveyor.dashboard.pages import (
    back_with,
    checked_form,
    csrf_refused,
    error_page,
    list_page,
    post_action,
    posted_form,
    remote_of,
    render,
    same_origin,
    session_of,
    sessions_service,
    to_sign_in,
)
from conveyor.dashboard.service import Session, SignInRefused
from conveyor.dashboard.sessions import COOKIE_NAME
from conveyor.dashboard.views import (
    TERMINAL_RUN_STATUSES,
    jobs_in_needs_order,
    open_step_index,
    safe_next,
    visible_agents,
)
from conveyor.events.models import OUTCOMES, STATES
from conveyor.matching.trace_text import run_trace_lines
from conveyor.model.ids import utc_now
from conveyor.model.permissions import role_allows

log = logging.getLogger(__name__)

router = APIRouter(prefix="/ui", include_in_schema=False)
STATIC_DIR = Path(__file__).parent / "static"

LOG_PREVIEW_BYTES = 256 * 1024
RUN_STATUSES = ("queued", "running", "success", "failed", "cancelled")
DELIVERY_STATUSES = ("received", "processed", "failed")


# -- sign-in -----------------------------------------------------------------------------------------


@router.get("/sign-in")
async def sign_in_page(request: Request) -> Response:
    """The one unauthenticated page: paste an admin token."""
    return render(request, "sign_in.html", None, next=safe_next(request.query_params.get("next")))


@router.post("/sign-in")
async def sign_in(request: Request) -> Response:
    """Exchange a pasted token for a session cookie; failures are throttled per address and counted.

    A post from another site is refused before the token is looked at (login CSRF: a foreign page
    would otherwise sign this browser in to a session of the attacker's choosing).
    """
    if not same_origin(request):
        answer = ApiAnswer(403, {"error": "csrf", "detail": "a sign-in posted from another site is refused"})
        return error_page(request, None, answer)
    service = sessions_service(request)
    remote = remote_of(request)
    form = await request.form()
    target = safe_next(str(form.get("next") or ""))
    wait = service.retry_after(remote)
    if wait is not None:
        request.app.state.metrics.admin_auth_failures.labels("throttled").inc()
        response = render(
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
        return render(request, "sign_in.html", None, status=401, next=target, error=str(refused))
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
    session = await session_of(request)
    if session is None:
        return to_sign_in(request)
    if await checked_form(request, session) is None:
        return csrf_refused(request, session)
    await sessions_service(request).end(session.id)
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
    return await list_page(
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
    session = await session_of(request)
    if session is None:
        return to_sign_in(request)
    answer = await call_api(request, session.principal, "GET", f"/runs/{quote(run_id, safe='')}")
    if not answer.ok:
        return error_page(request, session, answer)
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
    return render(
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
    session = await session_of(request)
    if session is None:
        return to_sign_in(request)
    path = f"/runs/{quote(run_id, safe='')}/jobs/{quote(job_id, safe='')}/logs/raw"
    return ApiStream(
        request, session.principal, path, lambda answer: error_page(request, session, answer), forward=()
    )


@router.get("/runs/{run_id}/artifacts/{name}")
async def artifact_download(run_id: str, name: str, request: Request) -> Response:
    """An artifact's bytes, streamed from the admin API as the signed-in session (artifact.read)."""
    session = await session_of(request)
    if session is None:
        return to_sign_in(request)
    path = f"/runs/{quote(run_id, safe='')}/artifacts/{quote(name, safe='')}/content"
    return ApiStream(request, session.principal, path, lambda answer: error_page(request, session, answer))


@router.post("/runs/{run_id}/cancel")
async def cancel_run(run_id: str, request: Request) -> Response:
    """Cancel a run (run.cancel); the notice names the run."""
    path = f"/runs/{quote(run_id, safe='')}"

    async def notice(session: Session, answer: ApiAnswer) -> str:
        shown = await call_api(request, session.principal, "GET", path)
        name = f"run #{shown.body['number']}" if shown.ok else f"run {run_id}"
        return f"{name} cancelled" + _cancel_detail(answer.body)

    return await post_action(request, path + "/cancel", {}, f"/ui/runs/{run_id}", notice=notice)


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
    posted = await posted_form(request)
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
        return error_page(request, session, answer)
    return back_with(f"/ui/runs/{run_id}", "approved" if verb == "approve" else "rejected")


@router.post("/runs/{run_id}/rerun")
async def rerun(run_id: str, request: Request) -> Response:
    """Re-run a run, or only its failed jobs (run.rerun); opens the new run."""
    posted = await posted_form(request)
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
        return error_page(request, session, answer)
    what = "a re-run of its failed jobs" if failed_only else "a re-run"
    return back_with(f"/ui/runs/{answer.body['id']}", f"run #{answer.body['number']} started: {what}")


# -- deliveries and events ---------------------------------------------------------------------------

_DELIVERY_FILTERS = ("status", "source")


@router.get("/deliveries")
async def deliveries_page(request: Request) -> Response:
    """Webhook deliveries, newest first."""
    return await list_page(
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
    return await post_action(
        request, path + "/replay", None, f"/ui{path}", notice=f"delivery {delivery_id} replayed"
    )


_EVENT_FILTERS = ("name", "outcome", "state", "internal")


@router.get("/events")
async def events_page(request: Request) -> Response:
    """Internal events, newest first; Conveyor's own names only when asked (`?internal=1` or by name)."""
    show_internal = bool(request.query_params.get("internal") or request.query_params.get("name"))
    return await list_page(
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
    session = await session_of(request)
    if session is None:
        return to_sign_in(request)
    answer = await call_api(request, session.principal, "GET", f"/events/{quote(event_id, safe='')}")
    if not answer.ok:
        return error_page(request, session, answer)
    return render(request, "event.html", session, event=answer.body["event"], runs=answer.body["runs"])


@router.get("/events/{event_id}/payload")
async def event_payload(event_id: str, request: Request) -> Response:
    """An event's payload, redacted; refused without event.read_payload."""
    return await _payload(request, f"/events/{quote(event_id, safe='')}/payload", f"event {event_id}")


async def _detail(request: Request, api_path: str, template: str, name: str) -> Response:
    session = await session_of(request)
    if session is None:
        return to_sign_in(request)
    answer = await call_api(request, session.principal, "GET", api_path)
    if not answer.ok:
        return error_page(request, session, answer)
    return render(request, template, session, **{name: answer.body})


async def _payload(request: Request, api_path: str, title: str) -> Response:
    session = await session_of(request)
    if session is None:
        return to_sign_in(request)
    answer = await call_api(request, session.principal, "GET", api_path)
    if not answer.ok:
        return error_page(request, session, answer)
    return render(request, "payload.html", session, title=title, payload=answer.body.get("payload"))


# -- dead letters ------------------------------------------------------------------------------------


@router.get("/dlq")
async def dlq_page(request: Request) -> Response:
    """Dead-lettered events with retry and discard (for roles that may)."""
    return await list_page(request, "/event-dlq", (), "dlq.html")


@router.post("/dlq/{event_id}/retry")
async def dlq_retry(event_id: str, request: Request) -> Response:
    """Retry a dead letter (event_dlq.manage)."""
    return await post_action(
        request,
        f"/event-dlq/{quote(event_id, safe='')}/retry",
        None,
        "/ui/dlq",
        notice=f"event {event_id} queued for retry",
    )


@router.post("/dlq/{event_id}/discard")
async def dlq_discard(event_id: str, request: Request) -> Response:
    """Discard a dead letter (event_dlq.manage)."""
    return await post_action(
        request,
        f"/event-dlq/{quote(event_id, safe='')}",
        None,
        "/ui/dlq",
        method="DELETE",
        notice=f"event {event_id} discarded",
    )


# -- agents, scalers, cluster ------------------------------------------------------------------------


@router.get("/agents")
async def agents_page(request: Request) -> Response:
    """Agents (labels, capacity, current jobs), scalers (capacity, backoff) and orphans."""
    session = await session_of(request)
    if session is None:
        return to_sign_in(request)
    agents = await call_api(request, session.principal, "GET", "/agents", query={"limit": 500})
    if not agents.ok:
        return error_page(request, session, agents)
    show_gone = bool(request.query_params.get("gone"))
    gone_ms = request.app.state.server.settings.dashboard_agent_gone_ms
    shown, hidden = visible_agents(agents.body["items"], utc_now(), gone_ms, show_gone=show_gone)
    scalers = await call_api(request, session.principal, "GET", "/scaler/status")
    orphans = await call_api(request, session.principal, "GET", "/scaler/orphans")
    return render(
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


@router.get("/cluster")
async def cluster_page(request: Request) -> Response:
    """Instances, the leader, peers (workers and coordinators on the peer channel), settings propagation."""
    session = await session_of(request)
    if session is None:
        return to_sign_in(request)
    status = await call_api(request, session.principal, "GET", "/cluster/status")
    if not status.ok:
        return error_page(request, session, status)
    propagation = await call_api(request, session.principal, "GET", "/cluster-settings/propagation")
    peers = await call_api(request, session.principal, "GET", "/peers")
    return render(
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
    session = await session_of(request)
    answer = ApiAnswer(404, {"error": "not_found", "detail": f"there is no dashboard page /ui/{unknown}"})
    return error_page(request, session, answer)


def install(app: FastAPI) -> None:
    """Serve the packaged static files, the pages, and `/` as a redirect to the dashboard.

    The static mount and the management pages go first: the pages end in a catch-all 404 that would
    otherwise answer for them.
    """
    app.mount("/ui/static", StaticFiles(directory=STATIC_DIR), name="dashboard-static")
    app.include_router(manage_router)
    app.include_router(router)

    @app.get("/", include_in_schema=False)
    async def root() -> Response:
        return RedirectResponse("/ui/", status_code=307)
