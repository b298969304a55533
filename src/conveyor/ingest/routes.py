"""Admin routes of ingest: sources, local triggers, deliveries (docs/design/admin.md §4)."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator

from conveyor.admin.pagination import DEFAULT_LIMIT
from conveyor.execution import store as execution_store
from conveyor.http import Principal, database, log_write, require
from conveyor.http.paging import Page
from conveyor.ingest import store
from conveyor.ingest.providers.base import SourceRow
from conveyor.ingest.providers.gitcmd import GitError, run_git
from conveyor.ingest.providers.local import commit_exists
from conveyor.ingest.service import IngestService, ManualRunError, ingest_service
from conveyor.ingest.truncation import truncation_of
from conveyor.model.errors import ApiError, conflict, not_found
from conveyor.model.gitnames import ref_problem
from conveyor.model.ids import new_id

router = APIRouter()

SourceKind = Literal["github", "git", "local", "generic"]
NULL_SHA = "0" * 40


def _valid_ref(value: str | None) -> str | None:
    """A branch or ref name as `git check-ref-format` accepts it (it reaches git and forge APIs)."""
    if value is not None and (problem := ref_problem(value)) is not None:
        raise ValueError(f"{problem}; expected a branch or ref name")
    return value


class SourceCreate(BaseModel):
    """Body of `POST sources` (docs/design/execution.md §1)."""

    model_config = ConfigDict(extra="forbid")
    kind: SourceKind
    name: str = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]*$")
    repo: str | None = Field(default=None, max_length=500)
    path: str | None = Field(default=None, max_length=4096)
    clone_url: str | None = None
    api_url: str | None = None
    default_branch: str | None = None
    verify: Literal["hmac", "token", "none"] = "hmac"
    signature_header: str | None = None
    event_header: str | None = None
    report: Literal["statuses", "checks", "none"] | None = None
    fork_pull_requests: Literal["hold", "run-without-secrets", "refuse"] | None = None
    webhook_secret: str | None = Field(default=None, min_length=1, max_length=4096)

    _check_default_branch = field_validator("default_branch")(_valid_ref)


class SourceUpdate(BaseModel):
    """Body of `PATCH sources/{id}`."""

    model_config = ConfigDict(extra="forbid")
    enabled: bool | None = None
    default_branch: str | None = None
    clone_url: str | None = None
    api_url: str | None = None
    report: Literal["statuses", "checks", "none"] | None = None
    fork_pull_requests: Literal["hold", "run-without-secrets", "refuse"] | None = None
    public_badges: bool | None = None
    webhook_secret: str | None = Field(default=None, min_length=1, max_length=4096)
    webhook_secret_next: str | None = Field(default=None, min_length=1, max_length=4096)

    _check_default_branch = field_validator("default_branch")(_valid_ref)


class TriggerBody(BaseModel):
    """Body of `POST sources/{id}/trigger`."""

    model_config = ConfigDict(extra="forbid")
    ref: str = Field(min_length=1)
    sha: str = Field(pattern=r"^[0-9a-f]{40}$")
    before: str = Field(default=NULL_SHA, pattern=r"^[0-9a-f]{40}$")
    delivery_id: str = Field(default_factory=new_id, min_length=1, max_length=200)

    _check_ref = field_validator("ref")(_valid_ref)


def _public_source(request: Request, row: dict[str, Any]) -> dict[str, Any]:
    shown = {k: v for k, v in row.items() if k != "org_id"}
    if row["kind"] in ("github", "git", "generic"):
        base = str(request.base_url).rstrip("/")
        server = getattr(request.app.state, "server", None)
        if server is not None and server.settings.public_url:
            base = server.settings.public_url.rstrip("/")
        shown["webhook_url"] = f"{base}/webhooks/{row['id']}"
    return shown


def _check_scope(principal: Principal, routing_key: str | None, what: str) -> None:
    if not principal.may_see(routing_key):
        raise not_found(what)


def _source_values(body: SourceCreate) -> dict[str, Any]:
    repo: str
    clone_url: str | None
    if body.kind == "local":
        if not body.path:
            raise ApiError(422, "invalid_body", "path: a local source needs the repository path")
        path = Path(body.path).expanduser().resolve()
        if not (path / ".git").exists() and not (path / "HEAD").exists():
            raise ApiError(422, "invalid_body", f"path: {path} is not a git repository")
        repo, clone_url = str(path), body.clone_url or f"file://{path}"
    elif body.kind == "github":
        if not body.repo or "/" not in body.repo:
            raise ApiError(422, "invalid_body", "repo: a github source needs OWNER/NAME or OWNER/*")
        if not body.webhook_secret:
            raise ApiError(
                422, "invalid_body", "webhook_secret: a github source cannot be created without one"
            )
        repo = body.repo
        clone_url = body.clone_url or (
            None if body.repo.endswith("/*") else f"https://github.com/{body.repo}.git"
        )
    elif body.kind == "git":
        if not body.clone_url and not body.repo:
            raise ApiError(422, "invalid_body", "clone_url: a git source needs the URL to fetch from")
        repo = body.repo or str(body.clone_url)
        clone_url = body.clone_url or body.repo
    else:
        repo, clone_url = body.repo or body.name, None
    return {
        "org_id": "default",
        "name": body.name,
        "kind": body.kind,
        "routing_key": f"{body.kind}:{body.name}",
        "repo": repo,
        "api_url": body.api_url,
        "clone_url": clone_url,
        "default_branch": body.default_branch or "main",
        "verify": "hmac" if body.kind == "github" else body.verify,
        "signature_header": body.signature_header,
        "event_header": body.event_header,
        "report": body.report or ("statuses" if body.kind == "github" else "none"),
        "fork_pull_requests": body.fork_pull_requests or "hold",
    }


@router.post("/sources", status_code=201, operation_id="sources.create")
async def create_source(
    body: SourceCreate,
    request: Request,
    principal: Principal = Depends(require("source.manage")),
    service: IngestService = Depends(ingest_service),
) -> dict[str, Any]:
    """Add a source; its webhook secret goes to the secret store (scope `source:<id>`)."""
    values = _source_values(body)
    async with database(request).transaction() as conn:
        source = await store.insert_new_source(conn, values)
        if source is None:
            raise conflict("conflict", f"a source named {body.name} already exists")
        if body.webhook_secret:
            await service.secrets.set_source_secret(
                conn, source.id, "webhook_secret", body.webhook_secret, updated_by=principal.token_id
            )
        await log_write(request, conn, target_type="source", target_id=source.id, status_code=201)
        row = await store.source_row(conn, source.id)
    assert row is not None
    return _public_source(request, row)


@router.get("/sources", operation_id="sources.list")
async def list_sources(
    request: Request, principal: Principal = Depends(require("source.read", scoped=True))
) -> dict[str, Any]:
    """Every source (a scoped token sees its own)."""
    async with database(request).read() as conn:
        rows = await store.list_sources(conn, principal.routing_key)
    return {"items": [_public_source(request, r) for r in rows], "next_cursor": None}


async def _source_or_404(request: Request, principal: Principal, ref: str) -> SourceRow:
    async with database(request).read() as conn:
        source = await store.find_source(conn, ref)
    if source is None:
        raise not_found(f"source {ref}")
    _check_scope(principal, source.routing_key, f"source {ref}")
    return source


@router.get("/sources/{source_id}", operation_id="sources.show")
async def show_source(
    source_id: str, request: Request, principal: Principal = Depends(require("source.read", scoped=True))
) -> dict[str, Any]:
    """One source."""
    source = await _source_or_404(request, principal, source_id)
    async with database(request).read() as conn:
        row = await store.source_row(conn, source.id)
    assert row is not None
    return _public_source(request, row)


@router.patch("/sources/{source_id}", operation_id="sources.update")
async def update_source(
    source_id: str,
    body: SourceUpdate,
    request: Request,
    principal: Principal = Depends(require("source.manage")),
    service: IngestService = Depends(ingest_service),
) -> dict[str, Any]:
    """Change a source (secrets go to the secret store)."""
    source = await _source_or_404(request, principal, source_id)
    values = body.model_dump(exclude_none=True, exclude={"webhook_secret", "webhook_secret_next"})
    async with database(request).transaction() as conn:
        if values:
            await store.update_source(conn, source.id, values)
        for name in ("webhook_secret", "webhook_secret_next"):
            value = getattr(body, name)
            if value:
                await service.secrets.set_source_secret(
                    conn, source.id, name, value, updated_by=principal.token_id
                )
        await log_write(request, conn, target_type="source", target_id=source.id, status_code=200)
        row = await store.source_row(conn, source.id)
    assert row is not None
    return _public_source(request, row)


@router.delete("/sources/{source_id}", status_code=204, operation_id="sources.delete")
async def delete_source(
    source_id: str,
    request: Request,
    principal: Principal = Depends(require("source.manage")),
    service: IngestService = Depends(ingest_service),
) -> Response:
    """Remove a source and its secrets."""
    source = await _source_or_404(request, principal, source_id)
    async with database(request).transaction() as conn:
        await store.delete_source(conn, source.id)
        await service.secrets.delete_source_secrets(conn, source.id)
        await log_write(request, conn, target_type="source", target_id=source.id, status_code=204)
    return Response(status_code=204)


@router.get("/sources/{source_id}/webhook-secret", operation_id="sources.webhook_secret")
async def webhook_secret(
    source_id: str,
    request: Request,
    principal: Principal = Depends(require("source.manage")),
    service: IngestService = Depends(ingest_service),
) -> dict[str, Any]:
    """The webhook secret to paste into the forge's settings."""
    source = await _source_or_404(request, principal, source_id)
    return {"source_id": source.id, "webhook_secret": await service.secret(source.id, "webhook_secret")}


@router.post("/sources/{source_id}/trigger", operation_id="sources.trigger")
async def trigger_local(
    source_id: str,
    body: TriggerBody,
    request: Request,
    principal: Principal = Depends(require("source.trigger", scoped=True)),
    service: IngestService = Depends(ingest_service),
) -> Response:
    """A push to a `local` source: stored as a delivery (deduplicated by `delivery_id`), then processed."""
    source = await _source_or_404(request, principal, source_id)
    if source.kind != "local":
        raise ApiError(400, "wrong_source_kind", f"source {source.name} is {source.kind}, not local")
    path = Path(source.repo)
    if not await commit_exists(path, body.sha):
        raise ApiError(400, "unknown_sha", f"commit {body.sha} is not in {path}")
    try:
        message = (await run_git("log", "-1", "--format=%B", "--end-of-options", body.sha, cwd=path)).decode(
            errors="replace"
        )
    except GitError:
        message = ""
    payload = {
        "ref": body.ref,
        "sha": body.sha,
        "before": body.before,
        "head_commit": {"id": body.sha, "message": message},
    }
    async with database(request).transaction() as conn:
        row_id, created = await store.insert_delivery(
            conn,
            store.NewDelivery(
                source=source,
                delivery_id=body.delivery_id,
                event="push",
                action=None,
                headers={},
                body=json.dumps(payload).encode(),
            ),
        )
        if created:
            await log_write(request, conn, target_type="delivery", target_id=row_id, status_code=202)
    if not created:
        return JSONResponse({"status": "duplicate", "delivery": row_id})
    return service.accepted(row_id)


DeliveryPage = Page[dict[str, Any]]


@router.get("/deliveries", operation_id="deliveries.list", response_model=DeliveryPage)
async def list_deliveries(
    request: Request,
    source: str | None = None,
    status: str | None = None,
    since: datetime | None = None,
    before: datetime | None = None,
    limit: int = Query(DEFAULT_LIMIT),
    cursor: str | None = None,
    principal: Principal = Depends(require("event.read", scoped=True)),
) -> DeliveryPage:
    """Deliveries newest first (metadata only)."""
    filters = {
        "source_id": source,
        "status": status,
        "since": since,
        "before": before,
        "routing_key": principal.routing_key,
    }
    async with database(request).read() as conn:
        rows, following = await store.page_deliveries(conn, filters=filters, limit=limit, cursor=cursor)
    return DeliveryPage(items=rows, next_cursor=following)


async def _delivery_or_404(request: Request, principal: Principal, delivery_id: str) -> dict[str, Any]:
    async with database(request).read() as conn:
        row = await store.get_delivery(conn, delivery_id)
        source = await store.get_source(conn, row["source_id"]) if row else None
    if row is None:
        raise not_found(f"delivery {delivery_id}")
    _check_scope(principal, source.routing_key if source else None, f"delivery {delivery_id}")
    row["routing_key"] = source.routing_key if source else None
    return row


@router.get("/deliveries/{delivery_id}", operation_id="deliveries.show")
async def show_delivery(
    delivery_id: str, request: Request, principal: Principal = Depends(require("event.read", scoped=True))
) -> dict[str, Any]:
    """A delivery: status, why (decisions, skipped, error) and the runs it created."""
    row = await _delivery_or_404(request, principal, delivery_id)
    async with database(request).read() as conn:
        run_ids = await execution_store.run_ids_of_delivery(conn, delivery_id)
    return {**{k: v for k, v in row.items() if k not in ("body", "org_id")}, "runs": run_ids}


@router.get("/deliveries/{delivery_id}/payload", operation_id="deliveries.payload")
async def delivery_payload(
    delivery_id: str,
    request: Request,
    principal: Principal = Depends(require("event.read_payload", scoped=True)),
) -> dict[str, Any]:
    """The stored body; one cut to `event_log_max_payload_bytes` is the kept text, and `truncated` says how
    much was kept of how much was received (docs/design/execution.md §1.1)."""
    row = await _delivery_or_404(request, principal, delivery_id)
    raw = store.delivery_body(row)
    cut = truncation_of(raw)
    try:
        payload: Any = json.loads(raw)
    except ValueError:
        payload = raw.decode(errors="replace")
    answer: dict[str, Any] = {"id": delivery_id, "payload": payload}
    if cut is not None:
        answer["truncated"] = {"kept": cut.kept, "received": cut.received}
    return answer


@router.post("/deliveries/{delivery_id}/replay", status_code=202, operation_id="deliveries.replay")
async def replay_delivery(
    delivery_id: str,
    request: Request,
    principal: Principal = Depends(require("event_dlq.manage", scoped=True)),
    service: IngestService = Depends(ingest_service),
) -> dict[str, Any]:
    """Process a `failed` delivery again."""
    await _delivery_or_404(request, principal, delivery_id)
    async with database(request).transaction() as conn:
        if not await store.replay_delivery(conn, delivery_id):
            raise conflict("conflict", f"delivery {delivery_id} is not failed")
        await log_write(request, conn, target_type="delivery", target_id=delivery_id, status_code=202)
    service.pipeline.kick(delivery_id)
    return {"status": "received", "delivery": delivery_id}


@router.get("/sources/{source_id}/workflows", operation_id="sources.workflows")
async def source_workflows(
    source_id: str,
    request: Request,
    ref: str | None = None,
    principal: Principal = Depends(require("source.read", scoped=True)),
    service: IngestService = Depends(ingest_service),
) -> dict[str, Any]:
    """The workflows of the lock at the tip of `ref` (default: the source's default branch), each with
    its `dispatch` trigger's types and typed inputs (null when it has none): what `POST runs` of that
    ref validates against (docs/design/execution.md §8.5)."""
    source = await _source_or_404(request, principal, source_id)
    try:
        branch, sha, lock = await service.pipeline.lock_at_ref(source, ref)
    except ManualRunError as exc:
        raise ApiError(400, exc.code, str(exc)) from exc
    workflows = []
    for entry in lock.workflows:
        dispatch = entry.dispatch_trigger()
        workflows.append(
            {
                "name": entry.name,
                "description": entry.description,
                "dispatch": None if dispatch is None else dispatch.model_dump(exclude={"type"}),
            }
        )
    return {
        "source": source.id,
        "name": source.name,
        "routing_key": source.routing_key,
        "ref": branch,
        "sha": sha,
        "workflows": workflows,
    }


class RunStart(BaseModel):
    """Body of `POST runs`: a manual run of a workflow's `dispatch` trigger."""

    model_config = ConfigDict(extra="forbid")
    source: str = Field(min_length=1)
    workflow: str = Field(min_length=1)
    ref: str | None = None
    inputs: dict[str, Any] = Field(default_factory=dict)


@router.post("/runs", status_code=201, operation_id="runs.start")
async def start_run(
    body: RunStart,
    request: Request,
    principal: Principal = Depends(require("source.trigger", scoped=True)),
    service: IngestService = Depends(ingest_service),
) -> dict[str, Any]:
    """Start a workflow through its `dispatch` trigger with validated, defaulted inputs."""
    source = await _source_or_404(request, principal, body.source)
    try:
        return await service.start_manual_run(
            source,
            workflow=body.workflow,
            ref=body.ref,
            inputs=body.inputs,
            sender=principal.label,
            triggered_by=principal.token_id,
            audit=lambda conn, run_id: log_write(
                request, conn, target_type="run", target_id=run_id, status_code=201
            ),
        )
    except ManualRunError as exc:
        raise ApiError(400, exc.code, str(exc)) from exc
