"""Admin routes of the scaler (docs/design/scaler.md §7, docs/design/admin.md §4 row "scaler"): status,
reload (here, or on other nodes: docs/design/scaler.md §3.1), orphans, and the shared configuration
(docs/design/scaler.md §11)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from conveyor.http import Principal, database, log_write, require
from conveyor.http.parts import parts_of
from conveyor.model.errors import ApiError
from conveyor.model.platforms import arch_name, os_name
from conveyor.parts import PartKey
from conveyor.runtime.boot import RUNTIME
from conveyor.scaler import store
from conveyor.scaler.config import Host, ScalerConfig, ScalerConfigError, content_sha256, parse_shared
from conveyor.scaler.manager import ReloadInProgress, ScalerManager
from conveyor.scaler.orphans import MAX_STOP_IDS, Orphans
from conveyor.scaler.registry import backend_registry
from conveyor.scaler.reload_results import ALL_NODES, reload_here, summarise
from conveyor.scaler.shared import SHARED_CONFIG

router = APIRouter()
log = logging.getLogger(__name__)

SCALER = PartKey[ScalerManager]("scaler")
ORPHANS = PartKey[Orphans]("scaler_orphans")


class OrphanForwarder(Protocol):
    """The cluster tier's forwarding of `--target` orphan requests over the peer channel (coordinators)."""

    async def listing(self, target: str, timeout_ms: int) -> dict[str, Any]:
        """The target node's orphan listing."""

    async def stop(self, target: str, vm_ids: list[str], timeout_ms: int) -> dict[str, Any]:
        """Stop orphans on the target node."""


ORPHAN_FORWARDER = PartKey[OrphanForwarder]("orphan_forwarder")


class ReloadForwarder(Protocol):
    """The cluster tier's side of `scaler reload --target` (coordinators): which nodes a target names, and
    one node's answer over the peer channel."""

    async def nodes(self, target: str) -> list[tuple[str, str]]:
        """(instance id, role) of every other node `target` names (`all`: every known peer); raises
        ApiError 404 `unknown_target` for a name nobody knows."""

    async def reload(self, node: str, role: str, timeout_ms: int) -> dict[str, Any]:
        """The node's answer (`reload_results.node_result`): reloaded, refused or unreachable."""


RELOAD_FORWARDER = PartKey[ReloadForwarder]("reload_forwarder")
TIMEOUT_MIN_MS, TIMEOUT_MAX_MS, TIMEOUT_DEFAULT_MS = 1_000, 60_000, 10_000


def _manager(request: Request) -> ScalerManager:
    manager = parts_of(request).get(SCALER)
    if manager is None:
        raise ApiError(503, "unavailable", "the scaler has not started on this node")
    return manager


def _orphans(request: Request) -> Orphans:
    orphans = parts_of(request).get(ORPHANS)
    if orphans is None:
        raise ApiError(503, "unavailable", "the scaler has not started on this node")
    return orphans


def _check_timeout(timeout_ms: int | None) -> None:
    if timeout_ms is not None and not TIMEOUT_MIN_MS <= timeout_ms <= TIMEOUT_MAX_MS:
        raise ApiError(
            400, "invalid_request", f"timeout_ms: must be between {TIMEOUT_MIN_MS} and {TIMEOUT_MAX_MS}"
        )


def _remote_target(request: Request, target: str | None, node: str) -> OrphanForwarder | None:
    """None for this node; for another one, the cluster tier's forwarder over the peer channel."""
    if target is None or target == node:
        return None
    forwarder = parts_of(request).get(ORPHAN_FORWARDER)
    if forwarder is None:  # coordinators start it with their peer hub, before the scaler
        raise ApiError(503, "unavailable", "the peer channel has not started on this node")
    return forwarder


@router.get("/scaler/status", operation_id="scaler.status")
async def scaler_status(request: Request, _: Principal = Depends(require("scaler.read"))) -> dict[str, Any]:
    """Per scaler: capacity, active, warm, backoff state and last error."""
    manager = _manager(request)
    watcher = parts_of(request).get(SHARED_CONFIG)
    config = watcher.status() if watcher is not None else {"origin": manager.config.origin}
    return {"node": manager.context.node_id, "scalers": manager.status(), "config": config}


class ScalerReload(BaseModel):
    """Body of `POST scaler/reload` (none: this node, as before `--target` existed)."""

    model_config = ConfigDict(extra="forbid")
    target: str | None = Field(default=None, min_length=1, max_length=64)
    timeout_ms: int | None = None


@router.post("/scaler/reload", operation_id="scaler.reload")
async def scaler_reload(
    request: Request, body: ScalerReload | None = None, _: Principal = Depends(require("scaler.manage"))
) -> dict[str, Any]:
    """Re-read scalers.yaml (and the config directory); apply everything or nothing. With `target` (an
    instance id or `all`), on those nodes, each answering reloaded, refused or unreachable."""
    manager = _manager(request)
    target = body.target if body is not None else None
    timeout_ms = body.timeout_ms if body is not None else None
    _check_timeout(timeout_ms)
    forwarder = parts_of(request).get(RELOAD_FORWARDER)
    me = manager.context.node_id
    others: list[tuple[str, str]] = []
    if target is not None and target != me:
        if forwarder is None:  # coordinators start it with their peer hub, before the scaler
            raise ApiError(503, "unavailable", "the peer channel has not started on this node")
        others = await forwarder.nodes(target)
    # An action that changes no row: its access-log row is committed first (docs/design/admin.md §5).
    async with database(request).transaction() as conn:
        await log_write(request, conn, target_type="scaler", target_id=target, status_code=200)
    if target is None:
        try:
            return await manager.reload()
        except ReloadInProgress as exc:
            raise ApiError(409, "reload_in_progress", str(exc)) from None
        except ScalerConfigError as exc:
            raise ApiError(
                422, "scaler_config_invalid", "; ".join(exc.problems) + "; the running configuration was kept"
            ) from None
    wait_ms = timeout_ms or TIMEOUT_DEFAULT_MS
    asks = [forwarder.reload(node, role, wait_ms) for node, role in others] if forwarder else []
    here = [reload_here(manager, me, "coordinator")] if target in (me, ALL_NODES) else []
    results = await asyncio.gather(*here, *asks)
    return summarise(target, me, results)


@router.get("/scaler/orphans", operation_id="scaler.orphans.list")
async def list_orphans(
    request: Request,
    target: str | None = Query(None, min_length=1, max_length=64),
    timeout_ms: int | None = Query(None),
    _: Principal = Depends(require("scaler.read")),
) -> dict[str, Any]:
    """Live VMs, containers and agent processes on the node, each tracked, untracked or unknown."""
    _check_timeout(timeout_ms)
    orphans = _orphans(request)
    remote = _remote_target(request, target, orphans.node_id)
    if remote is not None:
        assert target is not None
        return dict(await remote.listing(target, timeout_ms or TIMEOUT_DEFAULT_MS))
    return await orphans.listing()


class OrphanStop(BaseModel):
    """Body of `POST scaler/orphans/stop`."""

    model_config = ConfigDict(extra="forbid")
    target: str | None = Field(default=None, min_length=1, max_length=64)
    vm_ids: list[str]
    timeout_ms: int | None = None


@router.post("/scaler/orphans/stop", operation_id="scaler.orphans.stop")
async def stop_orphans(
    body: OrphanStop, request: Request, _: Principal = Depends(require("scaler.manage"))
) -> dict[str, Any]:
    """Stop the named items that are untracked right now; report the rest."""
    if not body.vm_ids or len(body.vm_ids) > MAX_STOP_IDS:
        raise ApiError(400, "invalid_request", f"vm_ids: give 1 to {MAX_STOP_IDS} ids")
    if any(not vm_id.strip() for vm_id in body.vm_ids):
        raise ApiError(400, "invalid_request", "vm_ids: an id is empty")
    _check_timeout(body.timeout_ms)
    orphans = _orphans(request)
    remote = _remote_target(request, body.target, orphans.node_id)
    async with database(request).transaction() as conn:
        await log_write(
            request,
            conn,
            target_type="scaler_orphans",
            target_id=",".join(body.vm_ids)[:200],
            status_code=200,
        )
    if remote is not None:
        assert body.target is not None
        return dict(await remote.stop(body.target, body.vm_ids, body.timeout_ms or TIMEOUT_DEFAULT_MS))
    return await orphans.stop(body.vm_ids)


# --- the shared configuration (docs/design/scaler.md §11)


class SharedConfigBody(BaseModel):
    """Body of `PUT scaler/config` and `POST scaler/config/validate`: the `scalers.yaml` text."""

    model_config = ConfigDict(extra="forbid")
    content: str


def _config_out(row: store.SharedConfigRow | None) -> dict[str, Any]:
    if row is None:
        return {"version": 0, "content": None, "sha256": None, "updated_at": None, "updated_by": None}
    return {
        "version": row.version,
        "content": row.content,
        "sha256": row.sha256,
        "updated_at": row.updated_at,
        "updated_by": row.updated_by,
    }


async def _validated(request: Request, content: str, version: int) -> ScalerConfig:
    """The checks of boot and reload (docs/design/scaler.md §4), then, when this node runs the shared
    configuration, the reload's checks against its running scalers; 422 `scaler_config_invalid` listing
    every problem."""
    host = Host(os=os_name(), arch=arch_name())
    try:
        # Validation may look at the host (a container engine's socket, a firecracker binary).
        config = await asyncio.to_thread(
            parse_shared, content, version=version, host=host, registry=backend_registry()
        )
        manager = parts_of(request).get(SCALER)
        watcher = parts_of(request).get(SHARED_CONFIG)
        if manager is not None and watcher is not None and not watcher.uses_local():
            problems = manager.reload_problems(config)
            if problems:
                raise ScalerConfigError(problems)
    except ScalerConfigError as exc:
        raise ApiError(
            422, "scaler_config_invalid", "; ".join(exc.problems) + "; nothing was stored"
        ) from None
    except (TypeError, ValueError, AttributeError) as exc:
        # A backend's check tripped over a value of an unexpected type: the text is not a usable
        # configuration, whatever the bug in the check (logged with its traceback).
        log.exception("validating a shared scaler configuration failed")
        raise ApiError(
            422, "scaler_config_invalid", f"the configuration cannot be validated: {exc}; nothing was stored"
        ) from None
    return config


async def _stored_version(request: Request) -> int:
    async with database(request).read() as conn:
        row = await store.read_shared_config(conn)
    return row.version if row is not None else 0


@router.get("/scaler/config", operation_id="scaler.config.get")
async def get_shared_config(
    request: Request, _: Principal = Depends(require("scaler.read"))
) -> dict[str, Any]:
    """The shared `scalers.yaml` and its version (0 and no content when none is stored)."""
    async with database(request).read() as conn:
        row = await store.read_shared_config(conn)
    return _config_out(row)


@router.post("/scaler/config/validate", operation_id="scaler.config.validate")
async def validate_shared_config(
    body: SharedConfigBody, request: Request, _: Principal = Depends(require("scaler.read"))
) -> dict[str, Any]:
    """Check a `scalers.yaml` as a set would, and store nothing."""
    config = await _validated(request, body.content, await _stored_version(request) + 1)
    return {"valid": True, "scalers": [entry.name for entry in config.entries]}


@router.put("/scaler/config", operation_id="scaler.config.set")
async def set_shared_config(
    body: SharedConfigBody, request: Request, principal: Principal = Depends(require("scaler.manage"))
) -> dict[str, Any]:
    """Validate and store the shared `scalers.yaml`; its version and the cluster settings' bump on a change."""
    await _validated(request, body.content, await _stored_version(request) + 1)
    async with database(request).transaction() as conn:
        row, settings_version, changed = await store.store_shared_config(
            conn, content=body.content, sha256=content_sha256(body.content), by=principal.token_id
        )
        await log_write(request, conn, target_type="scaler_config", target_id="default", status_code=200)
    if changed:
        runtime = parts_of(request).get(RUNTIME)
        if runtime is not None:  # this node's heartbeat advertises, and its watcher sees, the new version
            runtime.settings.forget_cluster()
        watcher = parts_of(request).get(SHARED_CONFIG)
        if watcher is not None:  # this node reloads at once; the others at their next look
            watcher.wake()
    return {**_config_out(row), "changed": changed, "cluster_settings_version": settings_version}
