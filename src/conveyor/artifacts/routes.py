"""Artifact routes (docs/design/artifacts.md §4, §7): the agents' transfer routes, which a job's credential
opens, and the admin routes under `/api/v1/admin`."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal
from urllib.parse import quote

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from conveyor.artifacts import caches, store
from conveyor.artifacts.provenance_service import ProvenanceService
from conveyor.artifacts.ranges import ByteRange, Unsatisfiable, parse_range
from conveyor.artifacts.service import ArtifactService
from conveyor.blobs.backend import SHA256_RE
from conveyor.db.tables import DEFAULT_ORG
from conveyor.http import Principal, database, log_write, require
from conveyor.http.parts import parts_of
from conveyor.model.errors import ApiError, not_found
from conveyor.model.ids import format_rfc3339
from conveyor.parts import PartKey

ARTIFACTS = PartKey[ArtifactService]("artifacts")
PROVENANCE = PartKey[ProvenanceService]("provenance")
UPLOAD_PREFIX = "/api/v1/uploads/"

router = APIRouter()
transport_router = APIRouter()


def artifact_service(request: Request) -> ArtifactService:
    """The published service; 503 while artifacts are not set up on this node."""
    service = parts_of(request).get(ARTIFACTS)
    if service is None:
        raise ApiError(503, "unavailable", "artifacts are not available on this node")
    return service


@dataclass(frozen=True)
class JobAccess:
    """The service and the job a transport route's credential opens."""

    service: ArtifactService
    scope: store.JobScope


async def job_access(job_id: str, request: Request, authorization: str | None = Header(None)) -> JobAccess:
    """The `{job_id}` of a transport route, when `Authorization` holds its live credential (401/403)."""
    service = artifact_service(request)
    return JobAccess(service, await service.authenticate(authorization, job_id))


class ArtifactOut(BaseModel):
    """An artifact of a run."""

    id: str
    run_id: str
    job_id: str
    job: str | None
    name: str
    format: Literal["file", "tar"]
    filename: str | None
    size: int
    sha256: str
    file_count: int
    created_at: str
    expires_at: str | None


class ArtifactList(BaseModel):
    """A run's artifacts, oldest first (at most 1000 a run, so no cursor)."""

    items: list[ArtifactOut]


class Failure(BaseModel):
    """A failing test."""

    name: str
    message: str = ""


class TestReportOut(BaseModel):
    """A JUnit summary recorded with a run."""

    id: str
    job_id: str
    job: str | None
    artifact: str
    passed: int
    failed: int
    skipped: int
    errors: int
    failures: list[Failure]
    created_at: str


class TestReportList(BaseModel):
    """A run's test summaries."""

    items: list[TestReportOut]


class CommitIn(BaseModel):
    """Make a stored upload the run's artifact."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(max_length=200)
    upload_id: str = Field(max_length=64)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    size: int = Field(ge=0)
    format: Literal["file", "tar"]
    filename: str | None = Field(default=None, max_length=255)
    file_count: int = Field(default=1, ge=0)
    retention_days: int | None = Field(default=None, ge=0, le=3650)


class TestReportIn(BaseModel):
    """A JUnit summary the step computed."""

    model_config = ConfigDict(extra="forbid")
    artifact: str = Field(max_length=200)
    passed: int = Field(ge=0)
    failed: int = Field(ge=0)
    skipped: int = Field(ge=0)
    errors: int = Field(ge=0)
    failures: list[Failure] = Field(default_factory=list, max_length=1000)


def artifact_out(row: dict[str, Any]) -> ArtifactOut:
    """The API form of an artifact row."""
    expires: datetime | None = row.get("expires_at")
    return ArtifactOut(
        id=row["id"],
        run_id=row["run_id"],
        job_id=row["job_id"],
        job=row.get("job_name"),
        name=row["name"],
        format=row["format"],
        filename=row.get("filename"),
        size=row["size"],
        sha256=row["blob_sha256"],
        file_count=row["file_count"],
        created_at=format_rfc3339(row["created_at"]),
        expires_at=None if expires is None else format_rfc3339(expires),
    )


def report_out(row: dict[str, Any]) -> TestReportOut:
    """The API form of a test report row."""
    return TestReportOut(
        id=row["id"],
        job_id=row["job_id"],
        job=row.get("job_name"),
        artifact=row["name"],
        passed=row["passed"],
        failed=row["failed"],
        skipped=row["skipped"],
        errors=row["errors"],
        failures=[Failure(**f) for f in row["failures"] or []],
        created_at=format_rfc3339(row["created_at"]),
    )


def download_name(row: dict[str, Any]) -> str:
    """The file name a download is saved under."""
    if row["format"] == "file" and row.get("filename"):
        return str(row["filename"])
    return f"{row['name']}.tar"


async def content_response(
    service: ArtifactService, row: dict[str, Any], range_header: str | None, method: str = "GET"
) -> Response:
    """The artifact's bytes as a (possibly partial) streamed answer (docs/design/artifacts.md §6)."""
    size = int(row["size"])
    headers = {
        "Accept-Ranges": "bytes",
        "ETag": f'"{row["blob_sha256"]}"',
        "Content-Disposition": f"attachment; filename*=UTF-8''{quote(download_name(row))}",
        "X-Conveyor-Sha256": row["blob_sha256"],
    }
    media = "application/x-tar" if row["format"] == "tar" else "application/octet-stream"
    try:
        byte_range: ByteRange | None = parse_range(range_header, size)
    except Unsatisfiable:
        return Response(status_code=416, headers={**headers, "Content-Range": f"bytes */{size}"})
    if byte_range is None:
        headers["Content-Length"] = str(size)
        return StreamingResponse(service.content(row, None), media_type=media, headers=headers)
    headers["Content-Range"] = byte_range.content_range()
    headers["Content-Length"] = str(byte_range.end - byte_range.start)
    return StreamingResponse(
        service.content(row, byte_range), status_code=206, media_type=media, headers=headers
    )


# -- the agents' routes (a job's credential) -------------------------------------------------------

# `?direct=1`: the agent would rather fetch a whole blob from the object store itself
# (docs/design/artifacts.md §4, "Direct downloads").
DIRECT = Query(False)


async def _redirect(service: ArtifactService, sha256: str) -> Response | None:
    """307 to a presigned URL of the blob, or None when the store has none (then the bytes come from here)."""
    url = await service.direct_url(sha256)
    if url is None:
        return None
    return Response(status_code=307, headers={"Location": url, "X-Conveyor-Sha256": sha256})


@transport_router.put(UPLOAD_PREFIX + "{job_id}", include_in_schema=False)
async def upload(request: Request, job: JobAccess = Depends(job_access)) -> JSONResponse:
    """Store an artifact's bytes (streamed); committed separately once the client agrees on the digest."""
    declared = request.headers.get("content-length")
    # `?purpose=cache`: a cache entry's bytes, bounded by its own knob (docs/design/caches.md §6).
    knob = "cache_max_entry_bytes" if request.query_params.get("purpose") == "cache" else "artifact_max_bytes"
    # `?sha256=`: the digest the agent computed first, when the store prefers it (docs/design/artifacts.md §4).
    expected = request.query_params.get("sha256")
    if expected is not None and not SHA256_RE.match(expected):
        raise ApiError(400, "invalid_digest", "sha256 must be 64 lower-case hex digits")
    result = await job.service.upload(
        job.scope,
        request.stream(),
        int(declared) if declared and declared.isdigit() else None,
        knob,
        expected,
    )
    return JSONResponse(result, status_code=201)


@transport_router.post("/api/v1/jobs/{job_id}/artifacts", include_in_schema=False)
async def commit(body: CommitIn, request: Request, job: JobAccess = Depends(job_access)) -> JSONResponse:
    """Make a stored upload the run's artifact."""
    row = await job.service.commit(job.scope, body.model_dump())
    async with database(request).read() as conn:
        found = await store.artifact_named(conn, job.scope.run_id, row["name"])
    return JSONResponse(artifact_out(found or row).model_dump(), status_code=201)


@transport_router.get("/api/v1/jobs/{job_id}/artifacts", include_in_schema=False)
async def job_artifacts(job: JobAccess = Depends(job_access)) -> ArtifactList:
    """The artifacts of the job's run."""
    return ArtifactList(items=[artifact_out(row) for row in await job.service.list_run(job.scope.run_id)])


@transport_router.get("/api/v1/jobs/{job_id}/artifacts/{name}/content", include_in_schema=False)
async def job_artifact_content(
    name: str,
    range_header: str | None = Header(None, alias="range"),
    direct: bool = DIRECT,
    job: JobAccess = Depends(job_access),
) -> Response:
    """An artifact of the job's run, for a later job."""
    row = await job.service.find(job.scope.run_id, name)
    if direct and range_header is None:
        redirect = await _redirect(job.service, row["blob_sha256"])
        if redirect is not None:
            return redirect
    return await content_response(job.service, row, range_header)


@transport_router.post("/api/v1/jobs/{job_id}/test-reports", include_in_schema=False)
async def job_test_report(body: TestReportIn, job: JobAccess = Depends(job_access)) -> JSONResponse:
    """Record a JUnit summary of one of the run's artifacts."""
    row = await job.service.record_test_report(job.scope, body.model_dump())
    return JSONResponse(report_out(row).model_dump(), status_code=201)


class CacheLookupIn(BaseModel):
    """What a restore looks for (docs/design/caches.md §4)."""

    model_config = ConfigDict(extra="forbid")
    key: str = Field(max_length=512)
    restore_keys: list[str] = Field(default_factory=list, max_length=32)


class CacheCommitIn(BaseModel):
    """File a stored upload as a cache entry."""

    model_config = ConfigDict(extra="forbid")
    key: str = Field(max_length=512)
    upload_id: str = Field(max_length=64)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    size: int = Field(ge=0)


# The step a lookup or a commit is for, recorded for the run page (docs/design/caches.md §7). A query parameter,
# not a body field: the bodies forbid unknown fields, and an older server must keep serving a newer agent.
STEP_INDEX = Query(None, ge=0, le=1_000_000)


@transport_router.post("/api/v1/jobs/{job_id}/caches/lookup", include_in_schema=False)
async def cache_lookup(
    body: CacheLookupIn, job: JobAccess = Depends(job_access), step_index: int | None = STEP_INDEX
) -> JSONResponse:
    """The entry a restore of the job takes: exact, partial or miss."""
    return JSONResponse(await caches.lookup(job.service, job.scope, body.model_dump(), step_index))


@transport_router.get("/api/v1/jobs/{job_id}/caches/content", include_in_schema=False)
async def cache_content(sha256: str, direct: bool = DIRECT, job: JobAccess = Depends(job_access)) -> Response:
    """The bytes of an entry the job may read."""
    chunks = await caches.content(job.service, job.scope, sha256)
    if direct:
        redirect = await _redirect(job.service, sha256)
        if redirect is not None:  # `chunks` never started: nothing was read from the store
            return redirect
    return StreamingResponse(
        chunks, media_type="application/zstd", headers={"ETag": f'"{sha256}"', "X-Conveyor-Sha256": sha256}
    )


@transport_router.post("/api/v1/jobs/{job_id}/caches", include_in_schema=False)
async def cache_commit(
    body: CacheCommitIn, job: JobAccess = Depends(job_access), step_index: int | None = STEP_INDEX
) -> JSONResponse:
    """File an uploaded entry; 200 `{saved: false}` when the key exists in the run's scope."""
    result = await caches.commit(job.service, job.scope, body.model_dump(), step_index)
    return JSONResponse(result, status_code=201 if result["saved"] else 200)


# -- admin routes --------------------------------------------------------------------------------------


async def _visible_run(request: Request, principal: Principal, run_id: str) -> None:
    """404 unless the run exists and the token may see it."""
    async with database(request).read() as conn:
        found = await store.run_routing(conn, run_id)
    if found is None or not principal.may_see(found[1]):
        raise not_found(f"run {run_id}")


@router.get("/runs/{run_id}/artifacts", operation_id="artifacts.list", response_model=ArtifactList)
async def list_artifacts(
    run_id: str, request: Request, principal: Principal = Depends(require("artifact.read", scoped=True))
) -> ArtifactList:
    """A run's artifacts: name, size, job, digest, expiry."""
    await _visible_run(request, principal, run_id)
    return ArtifactList(items=[artifact_out(row) for row in await artifact_service(request).list_run(run_id)])


@router.get(
    "/runs/{run_id}/artifacts/{name}/content",
    operation_id="artifacts.download",
    response_class=StreamingResponse,
    responses={200: {"content": {"application/octet-stream": {}}}, 206: {"description": "a range"}},
)
async def download_artifact(
    run_id: str,
    name: str,
    request: Request,
    range_header: str | None = Header(None, alias="range"),
    principal: Principal = Depends(require("artifact.read", scoped=True)),
) -> Response:
    """An artifact's bytes; `Range: bytes=a-b` serves a part (206)."""
    await _visible_run(request, principal, run_id)
    service = artifact_service(request)
    return await content_response(service, await service.find(run_id, name), range_header)


def provenance_service(request: Request) -> ProvenanceService:
    """The published provenance service; 503 while artifacts are not set up on this node."""
    service = parts_of(request).get(PROVENANCE)
    if service is None:
        raise ApiError(503, "unavailable", "artifact provenance is not available on this node")
    return service


NO_STORE = {"Cache-Control": "no-store"}


@router.get(
    "/runs/{run_id}/artifacts/{name}/provenance",
    operation_id="artifacts.provenance",
    responses={200: {"description": "the DSSE envelope of the artifact's in-toto statement"}},
)
async def artifact_provenance(
    run_id: str,
    name: str,
    request: Request,
    principal: Principal = Depends(require("artifact.read", scoped=True)),
) -> Response:
    """The artifact's signed provenance (a DSSE envelope), minted on the first request (docs/design/artifacts.md §9)."""
    await _visible_run(request, principal, run_id)
    _, stored = await provenance_service(request).statement(run_id, name)
    return Response(
        stored.envelope,
        media_type="application/json",
        headers={**NO_STORE, "X-Conveyor-Key-Id": stored.key_id},
    )


class ProvenanceCheck(BaseModel):
    """What a verification found: `verified` false names each problem (docs/design/artifacts.md §9)."""

    verified: bool
    problems: list[str]
    key_id: str
    public_key: str | None
    subject: dict[str, Any] | None
    stored_sha256: str | None
    builder_id: str | None
    build_type: str | None
    invocation_id: str | None
    started_on: str | None
    finished_on: str | None
    external_parameters: dict[str, Any]
    resolved_dependencies: list[dict[str, Any]]
    minted_at: str
    envelope: dict[str, Any]


@router.get(
    "/runs/{run_id}/artifacts/{name}/provenance/verify",
    operation_id="artifacts.provenance.verify",
    response_model=ProvenanceCheck,
)
async def verify_artifact_provenance(
    run_id: str,
    name: str,
    request: Request,
    principal: Principal = Depends(require("artifact.read", scoped=True)),
) -> JSONResponse:
    """Check the artifact's stored bytes against its verified statement (minted when it has none)."""
    await _visible_run(request, principal, run_id)
    found = await provenance_service(request).verify(run_id, name)
    return JSONResponse(ProvenanceCheck(**found).model_dump(mode="json"), headers=NO_STORE)


class CacheEntryOut(BaseModel):
    """A dependency cache entry (docs/design/caches.md §7)."""

    id: str
    source: str
    repo: str
    scope: str
    key: str
    size: int
    sha256: str
    created_at: str
    last_used_at: str


class CacheEntryList(BaseModel):
    """Entries, most recently used first (at most 1000), and the bytes they hold."""

    items: list[CacheEntryOut]
    total_bytes: int


def cache_entry_out(row: dict[str, Any]) -> CacheEntryOut:
    """The API form of a cache entry row."""
    return CacheEntryOut(
        id=row["id"],
        source=row["source"],
        repo=row["repo"],
        scope=row["scope"],
        key=row["key"],
        size=row["size"],
        sha256=row["blob_sha256"],
        created_at=format_rfc3339(row["created_at"]),
        last_used_at=format_rfc3339(row["last_used_at"]),
    )


@router.get("/caches", operation_id="caches.list", response_model=CacheEntryList)
async def list_caches(
    request: Request,
    source: str | None = Query(None, max_length=200),
    key_prefix: str | None = Query(None, max_length=512),
    _: Principal = Depends(require("cache.read")),
) -> CacheEntryList:
    """Dependency cache entries: key, branch scope, size, last use; `source` (id or name), `key_prefix`."""
    async with database(request).read() as conn:
        rows = await caches.admin_list(conn, DEFAULT_ORG, source, key_prefix)
    return CacheEntryList(items=[cache_entry_out(r) for r in rows], total_bytes=sum(r["size"] for r in rows))


@router.delete("/caches/{entry_id}", operation_id="caches.delete", status_code=204)
async def delete_cache(
    entry_id: str, request: Request, _: Principal = Depends(require("cache.manage"))
) -> Response:
    """Delete one cache entry; its blob goes with the next sweep once nothing else references it."""
    async with database(request).transaction() as conn:
        found = await caches.admin_delete(conn, DEFAULT_ORG, entry_id)
        if found is None:
            raise not_found(f"cache entry {entry_id}")
        await log_write(request, conn, target_type="cache_entry", target_id=entry_id, status_code=204)
    return Response(status_code=204)


@router.get("/runs/{run_id}/test-reports", operation_id="test_reports.list", response_model=TestReportList)
async def list_test_reports(
    run_id: str, request: Request, principal: Principal = Depends(require("run.read", scoped=True))
) -> TestReportList:
    """A run's JUnit summaries with their failing tests."""
    await _visible_run(request, principal, run_id)
    return TestReportList(
        items=[report_out(row) for row in await artifact_service(request).test_reports(run_id)]
    )
