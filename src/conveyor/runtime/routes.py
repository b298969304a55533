"""Admin routes of the runtime core: cluster settings, org settings, propagation, cluster status.

`GET/PATCH cluster-settings` (`cluster_settings.read`/`.write`), `GET cluster-settings/propagation`
(`cluster_settings.read`), `GET/PATCH org-settings/{org_id}` (`org_settings.read`/`.write`) and
`GET cluster/status` (`peer.read`); docs/design/cluster.md §5–§6, docs/design/admin.md §4.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from fastapi import APIRouter, Body, Depends, Request
from pydantic import BaseModel

from conveyor.db.tables import DEFAULT_ORG
from conveyor.http import Principal, database, log_write, require
from conveyor.http.parts import parts_of
from conveyor.model.errors import ApiError, bad_request, not_found
from conveyor.model.knobs import CLUSTER_KNOBS_BY_NAME, ORG_KNOBS_BY_NAME
from conveyor.runtime import store
from conveyor.runtime.boot import RuntimeServices, runtime_services
from conveyor.runtime.instances import stale_window
from conveyor.runtime.reports import PEER_VERSIONS, SelfReport, cluster_status, propagation_report
from conveyor.runtime.settings import (
    GLOBAL_SOURCES,
    SettingsRejected,
    cluster_view,
    org_effective,
    org_view,
    parse_global_sources,
    plan_settings_change,
)

router = APIRouter()


class ClusterSettingsOut(BaseModel):
    """`GET cluster-settings`: stored values (null = unset), effective values and defaults."""

    version: int
    updated_at: datetime | None
    updated_by: str | None
    settings: dict[str, int | None]
    effective: dict[str, int | None]
    defaults: dict[str, int | None]


class ClusterSettingsChanged(ClusterSettingsOut):
    """`PATCH cluster-settings`: the new state and the keys whose value changed."""

    changed: list[str]


class OrgSettingsOut(BaseModel):
    """`GET org-settings/{org_id}`: the org's overrides (null = inherit) and effective values."""

    org_id: str
    version: int
    updated_at: datetime | None
    updated_by: str | None
    # Knob overrides, and `global_sources` (a list of routing keys; docs/design/global_workflows.md §1).
    settings: dict[str, int | list[str] | None]
    effective: dict[str, int | list[str] | None]


class OrgSettingsChanged(OrgSettingsOut):
    """`PATCH org-settings/{org_id}`: the new state and the keys whose value changed."""

    changed: list[str]


class PropagationEntry(BaseModel):
    """One orchestrator's applied settings version."""

    instance_id: str
    role: str
    self: bool
    connected: bool
    applied_version: int
    status: Literal["in-sync", "behind", "ahead"]
    last_heartbeat_at: str | None
    last_heartbeat_age_ms: int | None


class PropagationOut(BaseModel):
    """`GET cluster-settings/propagation` (docs/design/cluster.md §5.3)."""

    current_version: int
    reported_by: str
    generated_at: str
    orchestrators: list[PropagationEntry]


def _services(request: Request) -> RuntimeServices:
    try:
        return runtime_services(parts_of(request))
    except LookupError as exc:
        raise ApiError(503, "unavailable", "the server is still starting; try again") from exc


def _cluster_defaults(services: RuntimeServices) -> dict[str, int | None]:
    return {name: services.settings.defaults.get(name) for name in CLUSTER_KNOBS_BY_NAME}


def _cluster_out(row: store.StoredSettings | None, services: RuntimeServices) -> dict[str, Any]:
    view = cluster_view(row, services.settings.defaults)
    return {
        "version": view.version,
        "updated_at": view.updated_at,
        "updated_by": view.updated_by,
        "settings": dict(view.stored),
        "effective": dict(view.effective),
        "defaults": _cluster_defaults(services),
    }


def _object_body(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise ApiError(
            422, "invalid_body", "body: must be a JSON object of setting names to integers or null"
        )
    return body


@router.get("/cluster-settings", operation_id="cluster_settings.get", response_model=ClusterSettingsOut)
async def get_cluster_settings(
    request: Request, _: Principal = Depends(require("cluster_settings.read"))
) -> dict[str, Any]:
    """The fleet knobs, read uncached: stored, effective and default values."""
    services = _services(request)
    async with database(request).read() as conn:
        row = await store.read_cluster_settings(conn)
    return _cluster_out(row, services)


@router.patch(
    "/cluster-settings", operation_id="cluster_settings.update", response_model=ClusterSettingsChanged
)
async def patch_cluster_settings(
    request: Request,
    body: Any = Body(default=None),
    principal: Principal = Depends(require("cluster_settings.write")),
) -> dict[str, Any]:
    """Set (integer) or clear (null) knobs; `version` bumps by one only when a value changes."""
    services = _services(request)
    patch = _object_body(body)
    async with database(request).transaction() as conn:
        stored = await store.lock_cluster_settings(conn)
        try:
            change = plan_settings_change(
                patch, stored.values, knobs=CLUSTER_KNOBS_BY_NAME, defaults=services.settings.defaults
            )
        except SettingsRejected as exc:
            raise bad_request(exc.code, exc.detail) from exc
        if change.bumps_version:
            await store.write_cluster_settings(
                conn,
                change.values,
                version=stored.version + 1,
                at=await store.database_now(conn),
                by=principal.token_id,
            )
        await log_write(request, conn, target_type="cluster_settings", target_id="default", status_code=200)
        row = await store.read_cluster_settings(conn)
    services.settings.forget_cluster()
    return {**_cluster_out(row, services), "changed": change.changed}


@router.get(
    "/cluster-settings/propagation",
    operation_id="cluster_settings.propagation",
    response_model=PropagationOut,
)
async def get_propagation(
    request: Request, _: Principal = Depends(require("cluster_settings.read"))
) -> dict[str, Any]:
    """How far the current settings version has spread: this node first, then every peer."""
    services = _services(request)
    async with database(request).read() as conn:
        row = await store.read_cluster_settings(conn)
        rows = await store.list_instances(conn)
        now = await store.database_now(conn)
    me = SelfReport(
        instance_id=services.identity.instance_id,
        role=services.identity.role,
        # Through the cache, as every read on this node: the version its reads serve right now.
        served_version=(await services.settings.cluster()).version,
        last_heartbeat_at=services.heartbeat.last_beat_at,
    )
    window = stale_window(services.stale_window_ms, 1)
    peer_versions = parts_of(request).get(PEER_VERSIONS)
    return propagation_report(
        current_version=row.version if row else 0,
        me=me,
        rows=rows,
        now=now,
        window=window,
        peers=peer_versions() if peer_versions is not None else (),
    )


async def _known_org(conn: Any, org_id: str) -> store.StoredSettings | None:
    row = await store.read_org_settings(conn, org_id)
    # One organisation per installation for now; another org exists once it has a settings row.
    if row is None and org_id != DEFAULT_ORG:
        raise not_found(f"org {org_id}")
    return row


def _org_out(
    org_id: str,
    row: store.StoredSettings | None,
    cluster: store.StoredSettings | None,
    services: RuntimeServices,
) -> dict[str, Any]:
    org = org_view(org_id, row)
    effective = org_effective(
        org, cluster_view(cluster, services.settings.defaults), services.settings.defaults
    )
    return {
        "org_id": org_id,
        "version": org.version,
        "updated_at": org.updated_at,
        "updated_by": org.updated_by,
        # Like a knob, an unset list is null (none) in `settings`; `effective` is always the list.
        "settings": {**org.stored, GLOBAL_SOURCES: list(org.global_sources) or None},
        "effective": {**effective, GLOBAL_SOURCES: list(org.global_sources)},
    }


@router.get("/org-settings/{org_id}", operation_id="org_settings.get", response_model=OrgSettingsOut)
async def get_org_settings(
    org_id: str, request: Request, _: Principal = Depends(require("org_settings.read"))
) -> dict[str, Any]:
    """An org's overrides and the values that apply to it (org > cluster > default)."""
    services = _services(request)
    async with database(request).read() as conn:
        row = await _known_org(conn, org_id)
        cluster = await store.read_cluster_settings(conn)
    return _org_out(org_id, row, cluster, services)


@router.patch("/org-settings/{org_id}", operation_id="org_settings.update", response_model=OrgSettingsChanged)
async def patch_org_settings(
    org_id: str,
    request: Request,
    body: Any = Body(default=None),
    principal: Principal = Depends(require("org_settings.write")),
) -> dict[str, Any]:
    """Set or clear an org's overrides; the row is created on the first PATCH."""
    services = _services(request)
    patch = dict(_object_body(body))
    sources_given = GLOBAL_SOURCES in patch
    sources_value = patch.pop(GLOBAL_SOURCES, None)
    async with database(request).transaction() as conn:
        await _known_org(conn, org_id)
        stored = await store.lock_org_settings(conn, org_id)
        try:
            change = plan_settings_change(
                patch, stored.values, knobs=ORG_KNOBS_BY_NAME, defaults=services.settings.defaults
            )
            sources = parse_global_sources(sources_value) if sources_given else stored.global_sources
        except SettingsRejected as exc:
            raise bad_request(exc.code, exc.detail) from exc
        changed = [*change.changed, *([GLOBAL_SOURCES] if sources != stored.global_sources else [])]
        if changed:
            await store.write_org_settings(
                conn,
                org_id,
                change.values,
                version=stored.version + 1,
                at=await store.database_now(conn),
                by=principal.token_id,
                global_sources=sources,
            )
        await log_write(request, conn, target_type="org_settings", target_id=org_id, status_code=200)
        row = await store.read_org_settings(conn, org_id)
        cluster = await store.read_cluster_settings(conn)
    services.settings.forget_org(org_id)
    return {**_org_out(org_id, row, cluster, services), "changed": changed}


@router.get("/cluster/status", operation_id="cluster.status")
async def get_cluster_status(
    request: Request, _: Principal = Depends(require("peer.read"))
) -> dict[str, Any]:
    """Instances, roles, the leader, heartbeat ages and each node's applied settings version."""
    services = _services(request)
    async with database(request).read() as conn:
        rows = await store.list_instances(conn)
        lease = await store.read_lease(conn)
        now = await store.database_now(conn)
    return cluster_status(
        me=services.identity.instance_id,
        rows=rows,
        lease=lease,
        now=now,
        window=stale_window(services.stale_window_ms, 1),
    )
