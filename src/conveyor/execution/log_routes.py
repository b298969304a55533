"""Admin routes of job logs: range reads and live follow over server-sent events
(docs/design/execution.md §9)."""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel

from conveyor.execution import log_store, store
from conveyor.execution.log_service import log_service
from conveyor.execution.logs import DEFAULT_LIMIT_BYTES, MAX_LIMIT_BYTES, log_filename
from conveyor.http import Principal, authorisation_check, database, require
from conveyor.model.errors import ApiError, not_found

router = APIRouter()


class LogRangeOut(BaseModel):
    """A piece of a log and where to read next."""

    text: str
    next_offset: int
    complete: bool
    times: list[str | None] | None = None
    # Which execution of the job this log is (`attempt.hop`, docs/design/execution.md §9): when a job runs
    # again and the log shown switches, offsets start over and a follower reads again from 0.
    execution: str


async def _check_job(
    request: Request, principal: Principal, run_id: str, job_id: str, step: int | None
) -> None:
    """404 unless the run (visible to this token), its job and the step exist."""
    async with database(request).read() as conn:
        run = await store.get_run(conn, run_id)
        if run is None or not principal.may_see(run["routing_key"]):
            raise not_found(f"run {run_id}")
        if await log_store.job_of_run(conn, run_id, job_id) is None:
            raise not_found(f"job {job_id} of run {run_id}")
        if step is not None and await log_store.log_status(conn, job_id, step) is None:
            raise not_found(f"step {step} of job {job_id}")


@router.get(
    "/runs/{run_id}/jobs/{job_id}/logs",
    operation_id="logs.read",
    response_model=LogRangeOut,
    response_model_exclude_unset=True,
)
async def read_log(
    run_id: str,
    job_id: str,
    request: Request,
    step: int | None = Query(
        None, ge=0, description="A step's log; the job's log (with step headers) without it."
    ),
    offset: int = Query(0, ge=0, description="Bytes into the log."),
    limit_bytes: int = Query(DEFAULT_LIMIT_BYTES, ge=1, le=MAX_LIMIT_BYTES),
    timestamps: bool = Query(False, description="Add `times`: each line's time (null for a header)."),
    principal: Principal = Depends(require("log.read", scoped=True)),
) -> LogRangeOut:
    """Up to `limit_bytes` of a job's or step's log from `offset`, ending on a line boundary."""
    await _check_job(request, principal, run_id, job_id, step)
    async with database(request).read() as conn:
        found = await log_store.read_range(
            conn, job_id, step=step, offset=offset, limit_bytes=limit_bytes, timestamps=timestamps
        )
    if found is None:
        raise not_found(f"job {job_id} of run {run_id}")
    answer = LogRangeOut(
        text=found.text, next_offset=found.next_offset, complete=found.complete, execution=found.execution
    )
    if found.times is not None:
        answer.times = found.times
    return answer


@router.get(
    "/runs/{run_id}/jobs/{job_id}/logs/raw",
    operation_id="logs.raw",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/plain": {}}}},
)
async def raw_log(
    run_id: str,
    job_id: str,
    request: Request,
    step: int | None = Query(None, ge=0, description="A step's log; the job's log without it."),
    principal: Principal = Depends(require("log.read", scoped=True)),
) -> StreamingResponse:
    """The whole log as a `text/plain` download, read in windows (never held in memory at once)."""
    await _check_job(request, principal, run_id, job_id, step)
    async with database(request).read() as conn:
        run = await store.get_run(conn, run_id)
        job = await log_store.job_of_run(conn, run_id, job_id)
    assert run is not None and job is not None  # _check_job found both
    filename = log_filename(str(run["workflow"]), run.get("number"), str(job["name"]), step)

    async def windows() -> AsyncIterator[bytes]:
        offset = 0
        while True:
            async with database(request).read() as conn:
                found = await log_store.read_range(
                    conn, job_id, step=step, offset=offset, limit_bytes=MAX_LIMIT_BYTES
                )
            if found is None or found.next_offset <= offset:
                return
            yield found.text.encode("utf-8")
            offset = found.next_offset

    return StreamingResponse(
        windows(),
        media_type="text/plain; charset=utf-8",
        headers={"Content-Disposition": f'attachment; filename="{filename}"', "Cache-Control": "no-store"},
    )


@router.get(
    "/runs/{run_id}/jobs/{job_id}/logs/stream",
    operation_id="logs.stream",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {}}}},
)
async def stream_log(
    run_id: str,
    job_id: str,
    request: Request,
    step: int | None = Query(None, ge=0),
    offset: int = Query(0, ge=0),
    last_event_id: str | None = Header(None, alias="Last-Event-ID"),
    principal: Principal = Depends(require("log.read", scoped=True)),
) -> StreamingResponse:
    """Server-sent events: `log` per line, `step`, and `end {status}` once the job is terminal."""
    if last_event_id is not None and last_event_id.strip():
        try:
            offset = int(last_event_id)
        except ValueError:
            raise ApiError(400, "invalid_request", "Last-Event-ID: must be an offset") from None
        if offset < 0:
            raise ApiError(400, "invalid_request", "Last-Event-ID: must be an offset")
    await _check_job(request, principal, run_id, job_id, step)
    service = log_service(request.app.state.server)
    return StreamingResponse(
        service.follow(job_id, step=step, offset=offset, authorised=authorisation_check(request)),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
