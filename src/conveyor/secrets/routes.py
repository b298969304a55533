"""Admin routes of secrets, environments and org variables (docs/design/admin.md §4, §6, §6.1).

No route returns a secret value: `PUT` answers the secret's metadata, lists carry names only.
Scopes contain `/` (`env/prod`), so secret paths use a `path` parameter for the scope; secret names
never contain `/`, so the last segment is always the name (`secrets/env/prod/TOKEN`). A client may
also percent-encode the scope (`secrets/env%2Fprod/TOKEN`): the server decodes the path first.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from fastapi import APIRouter, Depends, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.admin.pagination import DEFAULT_LIMIT
from conveyor.http import Principal, database, log_write, require
from conveyor.http.paging import Page
from conveyor.model.approvals import Protection, protection_problems
from conveyor.model.errors import ApiError, not_found
from conveyor.model.ids import utc_now
from conveyor.secrets import store
from conveyor.secrets.keys import SecretKeyMissing
from conveyor.secrets.rotation import RotationRefused, rotate_to_current_key, rotation_status
from conveyor.secrets.scopes import (
    MAX_SECRET_BYTES,
    InvalidName,
    check_allowed_branches,
    check_environment_name,
    check_secret_name,
    check_variable,
    environment_scope,
    parse_scope,
)
from conveyor.secrets.service import SECRETS, SecretService

router = APIRouter()


def secret_service(request: Request) -> SecretService:
    """The store published by the start-up hook; 503 while the node is still starting."""
    service = request.app.state.server.parts.get(SECRETS)
    if not isinstance(service, SecretService):
        raise ApiError(503, "unavailable", "the secret store is not ready yet; try again shortly")
    return service


def _bad(error: InvalidName) -> ApiError:
    return ApiError(400, error.code, str(error))


def _key_error(exc: SecretKeyMissing) -> ApiError:
    # This node cannot write under the cluster's newest key version (see `SecretService.write_key`).
    return ApiError(409, "key_missing", str(exc))


# --- models


class SecretValueBody(BaseModel):
    """Body of `PUT secrets/{scope}/{name}`: the value, which is never returned."""

    model_config = ConfigDict(extra="forbid")
    value: str


class SecretOut(BaseModel):
    """A secret's metadata; there is deliberately no value field."""

    id: str
    scope: str
    name: str
    key_version: int
    created_at: datetime
    updated_at: datetime
    updated_by: str | None
    updated_by_name: str | None  # the token's label, else its role and prefix

    @classmethod
    def of(cls, meta: store.SecretMeta) -> SecretOut:
        """From the stored metadata."""
        return cls(**meta.__dict__)


SecretPage = Page[SecretOut]


class VersionOut(BaseModel):
    """One key version in `GET secrets/rotation`."""

    version: int
    fingerprint: str
    created_at: datetime | None
    current: bool
    held: bool
    rows: dict[str, int]
    total: int


class RotationStatusOut(BaseModel):
    """`GET secrets/rotation`: rows per key version; remove an old key once it has 0 rows."""

    current_version: int | None
    current_fingerprint: str | None
    node_fingerprint: str
    rows_on_old_versions: int
    in_progress: bool
    versions: list[VersionOut]


class RotationOut(BaseModel):
    """`POST secrets/rotate-key`."""

    version: int
    reencrypted: dict[str, int]
    remaining: int


class EnvironmentBody(BaseModel):
    """Body of `PUT environments/{name}`; an omitted field keeps its value (empty on creation)."""

    model_config = ConfigDict(extra="forbid")
    variables: dict[str, str] | None = None
    allowed_branches: list[str] | None = None


class EnvironmentOut(BaseModel):
    """An environment: its variables (not secret) and allowed branches (empty = any)."""

    id: str
    name: str
    variables: dict[str, str]
    allowed_branches: list[str]
    created_at: datetime
    updated_at: datetime
    protection: dict[str, Any] | None = None


class ProtectionBody(BaseModel):
    """Body of `PUT environments/{name}/protection` (docs/design/approvals.md §1)."""

    model_config = ConfigDict(extra="forbid")
    approvers: list[str]
    refs: list[str] = Field(default_factory=list)
    wait_timer_ms: int = 0
    prevent_self_approval: bool = False


EnvironmentPage = Page[EnvironmentOut]


class VariableBody(BaseModel):
    """Body of `PUT variables/{name}`."""

    model_config = ConfigDict(extra="forbid")
    value: str


class VariableOut(BaseModel):
    """An org variable."""

    name: str
    value: str
    updated_at: datetime


class VariableList(BaseModel):
    """`GET variables` (every variable, by name)."""

    items: list[VariableOut]
    next_cursor: str | None = None


# --- secrets


@router.get("/secrets", operation_id="secrets.list", response_model=SecretPage)
async def list_secrets(
    request: Request,
    scope: str | None = None,
    limit: int = Query(DEFAULT_LIMIT),
    cursor: str | None = None,
    _: Principal = Depends(require("secret.read_meta")),
) -> SecretPage:
    """Secret names and metadata, newest first; never values."""
    if scope is not None:
        try:
            parse_scope(scope)
        except InvalidName as exc:
            raise _bad(exc) from None
    service = secret_service(request)
    async with database(request).read() as conn:
        rows, following = await store.page_secrets(
            conn, service.org_id, scope=scope, limit=limit, cursor=cursor
        )
        rows = store.with_updater_names(rows, await store.updater_names(conn, [r.updated_by for r in rows]))
    return SecretPage(items=[SecretOut.of(r) for r in rows], next_cursor=following)


@router.get("/secrets/rotation", operation_id="secrets.rotation_status", response_model=RotationStatusOut)
async def show_rotation_status(
    request: Request, _: Principal = Depends(require("secret.read_meta"))
) -> RotationStatusOut:
    """Rows per key version and table."""
    service = secret_service(request)
    status = await rotation_status(database(request), service.keyring, service.encrypted_columns)
    return RotationStatusOut(
        current_version=status.current_version,
        current_fingerprint=status.current_fingerprint,
        node_fingerprint=status.node_fingerprint,
        rows_on_old_versions=status.rows_on_old_versions,
        in_progress=status.in_progress,
        versions=[VersionOut(**v.__dict__) for v in status.versions],
    )


@router.post("/secrets/rotate-key", operation_id="secrets.rotate_key", response_model=RotationOut)
async def rotate_key(request: Request, _: Principal = Depends(require("secret.rotate_key"))) -> RotationOut:
    """Register the current key as the newest version and re-encrypt every older row under it."""
    service = secret_service(request)
    state = request.app.state.server
    settings = state.settings
    stale_window = timedelta(
        milliseconds=settings.cluster_heartbeat_interval_ms * settings.cluster_peer_stale_beats
    )

    async def record_start(conn: AsyncConnection) -> None:
        await log_write(
            request, conn, target_type="secret_key", target_id=service.fingerprint, status_code=200
        )

    try:
        result = await rotate_to_current_key(
            database(request),
            service.keyring,
            service.encrypted_columns,
            instance_id=state.instance_id or settings.instance_id,
            live_since=utc_now() - stale_window,
            record_start=record_start,
        )
    except RotationRefused as exc:
        raise ApiError(409, exc.code, str(exc)) from None
    return RotationOut(version=result.version, reencrypted=result.reencrypted, remaining=result.remaining)


@router.put("/secrets/{scope:path}/{name}", operation_id="secrets.set", response_model=SecretOut)
async def set_secret(
    scope: str,
    name: str,
    body: SecretValueBody,
    request: Request,
    response: Response,
    principal: Principal = Depends(require("secret.write")),
) -> SecretOut:
    """Create (201) or replace (200) a secret; the answer holds its metadata only."""
    try:
        parsed = parse_scope(scope)
        check_secret_name(name)
    except InvalidName as exc:
        raise _bad(exc) from None
    if len(body.value.encode("utf-8")) > MAX_SECRET_BYTES:
        raise ApiError(422, "invalid_body", f"value: must be at most {MAX_SECRET_BYTES} bytes of UTF-8")
    service = secret_service(request)
    async with database(request).transaction() as conn:
        if (
            parsed.environment is not None
            and await store.find_environment(conn, service.org_id, parsed.environment) is None
        ):
            raise not_found(
                f"environment {parsed.environment} (create it with `conveyor admin environment set "
                f"{parsed.environment}` first)"
            )
        try:
            written = await service.set_secret(conn, scope, name, body.value, updated_by=principal.token_id)
        except InvalidName as exc:
            raise _bad(exc) from None
        except SecretKeyMissing as exc:
            raise _key_error(exc) from None
        status = 201 if written.created else 200
        await log_write(request, conn, target_type="secret", target_id=f"{scope}/{name}", status_code=status)
        (meta,) = store.with_updater_names(
            [written.meta], await store.updater_names(conn, [written.meta.updated_by])
        )
    response.status_code = status
    return SecretOut.of(meta)


@router.delete("/secrets/{scope:path}/{name}", operation_id="secrets.delete", status_code=204)
async def delete_secret(
    scope: str, name: str, request: Request, _: Principal = Depends(require("secret.write"))
) -> Response:
    """Delete a secret."""
    try:
        parse_scope(scope)
        check_secret_name(name)
    except InvalidName as exc:
        raise _bad(exc) from None
    service = secret_service(request)
    async with database(request).transaction() as conn:
        if not await service.delete_secret(conn, scope, name):
            raise not_found(f"secret {name} in scope {scope}")
        await log_write(request, conn, target_type="secret", target_id=f"{scope}/{name}", status_code=204)
    return Response(status_code=204)


# --- environments


def _environment_out(row: store.EnvironmentRow) -> EnvironmentOut:
    return EnvironmentOut(**row.__dict__)


def _checked_environment_name(name: str) -> str:
    try:
        return check_environment_name(name)
    except InvalidName as exc:
        raise _bad(exc) from None


@router.get("/environments", operation_id="environments.list", response_model=EnvironmentPage)
async def list_environments(
    request: Request,
    limit: int = Query(DEFAULT_LIMIT),
    cursor: str | None = None,
    _: Principal = Depends(require("secret.read_meta")),
) -> EnvironmentPage:
    """Environments, newest first."""
    service = secret_service(request)
    async with database(request).read() as conn:
        rows, following = await store.page_environments(conn, service.org_id, limit=limit, cursor=cursor)
    return EnvironmentPage(items=[_environment_out(r) for r in rows], next_cursor=following)


@router.get("/environments/{name}", operation_id="environments.show", response_model=EnvironmentOut)
async def show_environment(
    name: str, request: Request, _: Principal = Depends(require("secret.read_meta"))
) -> EnvironmentOut:
    """One environment."""
    service = secret_service(request)
    async with database(request).read() as conn:
        row = await store.find_environment(conn, service.org_id, name)
    if row is None:
        raise not_found(f"environment {name}")
    return _environment_out(row)


@router.put("/environments/{name}", operation_id="environments.set", response_model=EnvironmentOut)
async def set_environment(
    name: str,
    body: EnvironmentBody,
    request: Request,
    response: Response,
    _: Principal = Depends(require("secret.write")),
) -> EnvironmentOut:
    """Create (201) or update (200) an environment."""
    _checked_environment_name(name)
    try:
        for key, value in (body.variables or {}).items():
            check_variable(key, value)
        check_allowed_branches(body.allowed_branches or [])
    except InvalidName as exc:
        raise _bad(exc) from None
    service = secret_service(request)
    now = utc_now()
    async with database(request).transaction() as conn:
        existing = await store.find_environment(conn, service.org_id, name)
        created = False
        if existing is None:
            created = (
                await store.insert_environment(
                    conn,
                    service.org_id,
                    name,
                    variables=body.variables or {},
                    allowed_branches=body.allowed_branches or [],
                    at=now,
                )
                is not None
            )
            existing = await store.find_environment(conn, service.org_id, name)
            assert existing is not None
        if not created:
            await store.update_environment(
                conn,
                service.org_id,
                name,
                variables=existing.variables if body.variables is None else body.variables,
                allowed_branches=existing.allowed_branches
                if body.allowed_branches is None
                else body.allowed_branches,
                at=now,
            )
        row = await store.find_environment(conn, service.org_id, name)
        assert row is not None
        status = 201 if created else 200
        await log_write(request, conn, target_type="environment", target_id=row.id, status_code=status)
    response.status_code = status
    return _environment_out(row)


@router.delete("/environments/{name}", operation_id="environments.delete", status_code=204)
async def delete_environment(
    name: str, request: Request, _: Principal = Depends(require("secret.write"))
) -> Response:
    """Delete an environment together with its `env/<name>` secrets."""
    service = secret_service(request)
    async with database(request).transaction() as conn:
        row = await store.find_environment(conn, service.org_id, name)
        if row is None or not await store.delete_environment(conn, service.org_id, name):
            raise not_found(f"environment {name}")
        await store.delete_scope(conn, service.org_id, environment_scope(name))
        await log_write(request, conn, target_type="environment", target_id=row.id, status_code=204)
    return Response(status_code=204)


@router.put(
    "/environments/{name}/protection", operation_id="environments.protect", response_model=EnvironmentOut
)
async def protect_environment(
    name: str, body: ProtectionBody, request: Request, _: Principal = Depends(require("secret.write"))
) -> EnvironmentOut:
    """Set (replace) the environment's protection rule: its jobs then wait for an approver."""
    problems = protection_problems(body.approvers, body.refs, body.wait_timer_ms)
    if problems:
        raise ApiError(422, "invalid_body", "; ".join(problems))
    rule = Protection(
        approvers=tuple(a.strip() for a in body.approvers),
        refs=tuple(r.strip() for r in body.refs),
        wait_timer_ms=body.wait_timer_ms,
        prevent_self_approval=body.prevent_self_approval,
    )
    service = secret_service(request)
    async with database(request).transaction() as conn:
        if not await store.set_protection(conn, service.org_id, name, rule.as_document(), utc_now()):
            raise not_found(f"environment {name}")
        row = await store.find_environment(conn, service.org_id, name)
        assert row is not None
        await log_write(request, conn, target_type="environment", target_id=row.id, status_code=200)
    return _environment_out(row)


@router.delete("/environments/{name}/protection", operation_id="environments.unprotect", status_code=204)
async def unprotect_environment(
    name: str, request: Request, _: Principal = Depends(require("secret.write"))
) -> Response:
    """Remove the protection rule; jobs already waiting keep waiting for a decision."""
    service = secret_service(request)
    async with database(request).transaction() as conn:
        row = await store.find_environment(conn, service.org_id, name)
        if row is None:
            raise not_found(f"environment {name}")
        await store.set_protection(conn, service.org_id, name, None, utc_now())
        await log_write(request, conn, target_type="environment", target_id=row.id, status_code=204)
    return Response(status_code=204)


# --- org variables


@router.get("/variables", operation_id="variables.list", response_model=VariableList)
async def list_variables(
    request: Request, _: Principal = Depends(require("secret.read_meta"))
) -> VariableList:
    """Every org variable, by name."""
    service = secret_service(request)
    async with database(request).read() as conn:
        rows = await store.list_variables(conn, service.org_id)
    return VariableList(items=[VariableOut(**r.__dict__) for r in rows])


@router.put("/variables/{name}", operation_id="variables.set", response_model=VariableOut)
async def set_variable(
    name: str,
    body: VariableBody,
    request: Request,
    response: Response,
    _: Principal = Depends(require("secret.write")),
) -> VariableOut:
    """Create (201) or replace (200) an org variable."""
    try:
        check_variable(name, body.value)
    except InvalidName as exc:
        raise _bad(exc) from None
    service = secret_service(request)
    now = utc_now()
    async with database(request).transaction() as conn:
        created = await store.set_variable(conn, service.org_id, name, body.value, now)
        status = 201 if created else 200
        await log_write(request, conn, target_type="variable", target_id=name, status_code=status)
    response.status_code = status
    return VariableOut(name=name, value=body.value, updated_at=now)


@router.delete("/variables/{name}", operation_id="variables.delete", status_code=204)
async def delete_variable(
    name: str, request: Request, _: Principal = Depends(require("secret.write"))
) -> Response:
    """Delete an org variable."""
    service = secret_service(request)
    async with database(request).transaction() as conn:
        if not await store.delete_variable(conn, service.org_id, name):
            raise not_found(f"variable {name}")
        await log_write(request, conn, target_type="variable", target_id=name, status_code=204)
    return Response(status_code=204)
