"""Admin routes of runs: list, show, jobs, and manual `dispatch` runs (docs/design/admin.md §4, §7)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from conveyor.admin.pagination import DEFAULT_LIMIT
from conveyor.execution import store
from conveyor.execution.approvals import DecisionRefused, NotWaiting, decide, pending_approvals
from conveyor.execution.cancel import AlreadyFinished, cancel_run
from conveyor.execution.dispatcher import DISPATCHER
from conveyor.execution.lifecycle import CancelOutcome, cancel_job
from conveyor.execution.seams import AGENT_SWEEP, STATUS_REPORTER
from conveyor.http import Principal, database, log_write, require
from conveyor.http.paging import Page
from conveyor.http.parts import parts_of
from conveyor.model.approvals import Approver, Decision
from conveyor.model.errors import ApiError, conflict, not_found
from conveyor.model.redact import redact_event_payload
from conveyor.model.states import JOB_TERMINAL, JobEnd, ended_because

router = APIRouter()


RunPage = Page[dict[str, Any]]


@router.get("/runs", operation_id="runs.list", response_model=RunPage)
async def list_runs(
    request: Request,
    status: str | None = None,
    workflow: str | None = None,
    routing_key: str | None = None,
    ref: str | None = Query(None, max_length=500),
    since: datetime | None = None,
    before: datetime | None = None,
    limit: int = Query(DEFAULT_LIMIT),
    cursor: str | None = None,
    principal: Principal = Depends(require("run.read", scoped=True)),
) -> RunPage:
    """Runs newest first."""
    routing_key = principal.scope_filter(routing_key, "read")
    filters = {
        "status": status,
        "workflow": workflow,
        "routing_key": routing_key,
        "ref": ref,
        "since": since,
        "before": before,
    }
    async with database(request).read() as conn:
        rows, following = await store.page_runs(conn, filters=filters, limit=limit, cursor=cursor)
    return RunPage(items=rows, next_cursor=following)


async def _run_or_404(request: Request, principal: Principal, run_id: str) -> dict[str, Any]:
    async with database(request).read() as conn:
        run = await store.get_run(conn, run_id)
    if run is None or not principal.may_see(run["routing_key"]):
        raise not_found(f"run {run_id}")
    return run


@router.get("/runs/{run_id}", operation_id="runs.show")
async def show_run(
    run_id: str, request: Request, principal: Principal = Depends(require("run.read", scoped=True))
) -> dict[str, Any]:
    """A run with its event, its decision trace and its jobs."""
    run = await _run_or_404(request, principal, run_id)
    async with database(request).read() as conn:
        run["jobs"] = await store.jobs_of_run(conn, run_id)
        run["pending_approvals"] = await pending_approvals(conn, run_id)
        links = await store.summon_links(conn, run)
    # Summon links both ways (docs/design/execution.md §8.6), each only where the caller may see that run.
    parent = links["summoned_by"]
    run["summoned_by"] = parent if parent and principal.may_see(parent["routing_key"]) else None
    run["summoned"] = [child for child in links["summoned"] if principal.may_see(child["routing_key"])]
    run.pop("workflow_lock", None)
    run["ended_because"] = ended_because(
        run["status"],
        run["reason"],
        (JobEnd(j["display_name"], j["status"], j["reason"], j["finished_at"]) for j in run["jobs"]),
    )
    # The triggering event's payload is a payload read surface (docs/design/events.md §7): a scale_up's claim
    # code and secret-like keys read as "[redacted]", as in the events API.
    event = run.get("event")
    if isinstance(event, dict) and isinstance(event.get("payload"), dict):
        run["event"] = {**event, "payload": redact_event_payload(event["payload"])}
    return run


@router.get("/runs/{run_id}/jobs", operation_id="runs.jobs")
async def run_jobs(
    run_id: str, request: Request, principal: Principal = Depends(require("run.read", scoped=True))
) -> dict[str, Any]:
    """A run's jobs and their steps."""
    await _run_or_404(request, principal, run_id)
    async with database(request).read() as conn:
        return {"items": await store.jobs_of_run(conn, run_id), "next_cursor": None}


class CancelBody(BaseModel):
    """Body of the cancel routes."""

    model_config = ConfigDict(extra="forbid")
    reason: str | None = Field(default=None, max_length=500)
    force: bool = False


async def _after_cancel(request: Request, outcome: CancelOutcome) -> None:
    parts = parts_of(request)
    dispatcher, reporter, agent_sweep = (
        parts.get(DISPATCHER),
        parts.get(STATUS_REPORTER),
        parts.get(AGENT_SWEEP),
    )
    if agent_sweep is not None:
        await agent_sweep()  # signal our own agents now rather than at the next sweep
    for effects in outcome.effects:
        if effects.queued_jobs and dispatcher is not None:
            dispatcher.wake()
    if reporter is not None:
        reporter.wake()


@router.post("/runs/{run_id}/cancel", status_code=202, operation_id="runs.cancel")
async def cancel_run_route(
    run_id: str,
    request: Request,
    body: CancelBody | None = None,
    principal: Principal = Depends(require("run.cancel", scoped=True)),
) -> dict[str, int]:
    """Cancel a run: queued jobs at once, running ones through their agents."""
    await _run_or_404(request, principal, run_id)
    body = body or CancelBody()
    reason = f"cancelled_by: {principal.label or principal.token_id}" + (
        f": {body.reason}" if body.reason else ""
    )
    async with database(request).transaction() as conn:
        try:
            outcome = await cancel_run(
                conn, run_id, reason=reason, force=body.force, cancelled_by=principal.token_id
            )
        except AlreadyFinished as exc:
            raise conflict("run_finished", str(exc)) from exc
        await log_write(request, conn, target_type="run", target_id=run_id, status_code=202)
    await _after_cancel(request, outcome)
    return {"cancelled": outcome.cancelled, "signalled": outcome.signalled}


@router.post("/runs/{run_id}/jobs/{job_id}/cancel", status_code=202, operation_id="runs.cancel_job")
async def cancel_job_route(
    run_id: str,
    job_id: str,
    request: Request,
    body: CancelBody | None = None,
    principal: Principal = Depends(require("run.cancel", scoped=True)),
) -> dict[str, int]:
    """Cancel one job (its dependants follow the needs rules)."""
    await _run_or_404(request, principal, run_id)
    body = body or CancelBody()
    reason = f"cancelled_by: {principal.label or principal.token_id}" + (
        f": {body.reason}" if body.reason else ""
    )
    outcome = CancelOutcome()
    async with database(request).transaction() as conn:
        status = await store.job_status(conn, run_id, job_id)
        if status is None:
            raise not_found(f"job {job_id}")
        if status in JOB_TERMINAL:
            raise conflict("job_finished", f"job {job_id} already finished ({status})")
        await cancel_job(conn, job_id, reason=reason, force=body.force, grace_ms=10_000, outcome=outcome)
        await log_write(request, conn, target_type="job", target_id=job_id, status_code=202)
    await _after_cancel(request, outcome)
    return {"cancelled": outcome.cancelled, "signalled": outcome.signalled}


class RerunBody(BaseModel):
    """Body of `POST runs/{id}/rerun`."""

    model_config = ConfigDict(extra="forbid")
    failed_only: bool = False


@router.post("/runs/{run_id}/rerun", status_code=201, operation_id="runs.rerun")
async def rerun_route(
    run_id: str,
    request: Request,
    body: RerunBody | None = None,
    principal: Principal = Depends(require("run.rerun", scoped=True)),
) -> dict[str, Any]:
    """A new run from this one's event and lock (same SHA); `failed_only` copies successful jobs."""
    from conveyor.execution.rerun import NotRerunnable, rerun

    await _run_or_404(request, principal, run_id)
    body = body or RerunBody()
    async with database(request).transaction() as conn:
        try:
            created = await rerun(
                conn,
                run_id,
                failed_only=body.failed_only,
                requested_by=principal.label or principal.token_id,
                triggered_by=principal.token_id,
            )
        except LookupError as exc:
            raise not_found(f"run {run_id}") from exc
        except NotRerunnable as exc:
            raise conflict("conflict", str(exc)) from exc
        await log_write(request, conn, target_type="run", target_id=created.id, status_code=201)
    parts = parts_of(request)
    for loop in (parts.get(DISPATCHER), parts.get(STATUS_REPORTER)):
        if loop is not None:
            loop.wake()
    run = await _run_or_404(request, principal, created.id)
    async with database(request).read() as conn:
        run["jobs"] = await store.jobs_of_run(conn, created.id)
    run.pop("workflow_lock", None)
    return run


class DecisionBody(BaseModel):
    """Body of the approve and reject routes (docs/design/approvals.md §3)."""

    model_config = ConfigDict(extra="forbid")
    comment: str | None = Field(default=None, max_length=1000)


async def _decide(
    request: Request,
    principal: Principal,
    run_id: str,
    job_id: str,
    decision: Decision,
    body: DecisionBody | None,
) -> dict[str, Any]:
    await _run_or_404(request, principal, run_id)
    comment = (body.comment or "").strip() or None if body is not None else None
    approver = Approver(principal.token_id, principal.label, principal.role)
    async with database(request).transaction() as conn:
        try:
            decided = await decide(
                conn, run_id, job_id, approver=approver, decision=decision, comment=comment
            )
        except LookupError as exc:
            raise not_found(f"job {job_id}") from exc
        except NotWaiting as exc:
            raise conflict("not_waiting", str(exc)) from exc
        except DecisionRefused as exc:
            raise ApiError(403, exc.refusal.code, exc.refusal.detail) from exc
        await log_write(request, conn, target_type="job", target_id=job_id, status_code=200)
    outcome = CancelOutcome(effects=[decided.effects])
    await _after_cancel(request, outcome)
    return {"job_id": decided.job_id, "status": decided.status, "approval": decided.approval}


@router.post("/runs/{run_id}/jobs/{job_id}/approve", operation_id="runs.approve_job")
async def approve_job_route(
    run_id: str,
    job_id: str,
    request: Request,
    body: DecisionBody | None = None,
    principal: Principal = Depends(require("run.approve", scoped=True)),
) -> dict[str, Any]:
    """Release a job waiting for its protected environment (queued after the wait timer)."""
    return await _decide(request, principal, run_id, job_id, "approved", body)


@router.post("/runs/{run_id}/jobs/{job_id}/reject", operation_id="runs.reject_job")
async def reject_job_route(
    run_id: str,
    job_id: str,
    request: Request,
    body: DecisionBody | None = None,
    principal: Principal = Depends(require("run.approve", scoped=True)),
) -> dict[str, Any]:
    """Fail a job waiting for its protected environment, with the comment as its reason."""
    return await _decide(request, principal, run_id, job_id, "rejected", body)
