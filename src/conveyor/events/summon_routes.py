"""The summon routes an agent calls with its job's credential (docs/design/execution.md §8.6), outside the admin
API like the artifact transport routes (docs/design/artifacts.md §4)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from conveyor.artifacts.routes import JobAccess, job_access
from conveyor.events.startup import EVENTS, event_settings
from conveyor.events.summon import SummonRefused, SummonService
from conveyor.http import database
from conveyor.http.parts import parts_of
from conveyor.ingest.service import INGEST
from conveyor.model.errors import ApiError, not_found

router = APIRouter()


class SummonIn(BaseModel):
    """A step's summon, as its agent sends it."""

    model_config = ConfigDict(extra="forbid")
    request_id: str = Field(min_length=1, max_length=64)
    workflow: str = Field(min_length=1, max_length=200)
    inputs: dict[str, Any] = Field(default_factory=dict)
    repo: str | None = Field(default=None, max_length=500)


def summon_service(request: Request) -> SummonService:
    """The summon service of this coordinator; 503 before ingest is up."""
    ingest = parts_of(request).get(INGEST)
    if ingest is None:
        raise ApiError(503, "unavailable", "summons are not available on this node")
    events = parts_of(request).get(EVENTS)
    settings = events.settings if events is not None else event_settings(request.app.state.server.settings)
    return SummonService(database(request), ingest.pipeline, settings.max_chain_depth)


@router.post("/api/v1/jobs/{job_id}/summons", include_in_schema=False)
async def summon(body: SummonIn, request: Request, job: JobAccess = Depends(job_access)) -> JSONResponse:
    """Start a run of `workflow`'s `dispatch` trigger for this job (201; 200 for a resend)."""
    try:
        started = await summon_service(request).summon(
            job.scope.job_id,
            request_id=body.request_id,
            workflow=body.workflow,
            inputs=body.inputs,
            repo=body.repo,
        )
    except SummonRefused as refusal:
        raise ApiError(refusal.status, refusal.code, refusal.detail) from refusal
    return JSONResponse(started, status_code=201 if started["created"] else 200)


@router.get("/api/v1/jobs/{job_id}/summons/{run_id}", include_in_schema=False)
async def summoned(run_id: str, request: Request, job: JobAccess = Depends(job_access)) -> dict[str, Any]:
    """A run this job summoned: status, reason and outputs."""
    found = await summon_service(request).status(job.scope.job_id, run_id)
    if found is None:
        raise not_found(f"run {run_id} summoned by job {job.scope.job_id}")
    return found
