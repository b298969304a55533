"""Admin routes of the scaler (docs/design/scaler.md §7, docs/design/admin.md §4 row "scaler"): status,
reload (here, or on other nodes: docs/design/scaler.md §3.1), orphans."""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from conveyor.http import Principal, database, log_write, require
from conveyor.http.parts import parts_of
from conveyor.model.errors import ApiError
from conveyor.parts import PartKey
from conveyor.scaler.config import ScalerConfigError
from conveyor.scaler.manager import ReloadInProgress, ScalerManager
from conveyor.scaler.orphans import MAX_STOP_IDS, Orphans
from conveyor.scaler.reload_results import ALL_NODES, reload_here, summarise

router = APIRouter()

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
    return {"node": manager.context.node_id, "scalers": manager.status()}


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
