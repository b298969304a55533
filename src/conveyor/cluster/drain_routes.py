"""HTTP surfaces of drain (docs/design/cluster.md §8, docs/design/admin.md §4 rows "peers" and "drain").

Admin (coordinators, under `/api/v1/admin`): `GET orchestrator/drain[?target=ID]` (`peer.read`) and
`POST orchestrator/drain {action, target?}` (`orchestrator.drain`). With a `target` other than this
node the POST is forwarded as `peer.drain.request`: an unknown peer is 404 `unknown_target`, a known
but disconnected one 503 `peer_not_connected`, no answer within 15 s 504 `peer_timeout`, a `peer.error`
answer 502 `peer_error`. A GET with a target answers from the peer's last heartbeat.

Worker (no admin API): `POST /drain` and `POST /resume`, served only when `CONVEYOR_WORKER_ADMIN_TOKEN`
is set and then only with `Authorization: Bearer <that token>` (compared in constant time; 401
otherwise). When the variable is unset both answer 404 `not_found`, as if the routes did not exist.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from conveyor.cluster.drain import DRAIN, PEER_DRAIN_TIMEOUT_S, NodeDrain, bearer_matches
from conveyor.cluster.forwarding import ask_peer, require_connected
from conveyor.cluster.messages import DrainRequest, DrainResponse
from conveyor.cluster.routes import started_hub
from conveyor.cluster.service import PeerHub
from conveyor.http import Principal, database, log_write, require
from conveyor.http.parts import parts_of
from conveyor.model.errors import ApiError
from conveyor.model.ids import new_id

log = logging.getLogger(__name__)

# Admin routes (mounted under /api/v1/admin on coordinators).
router = APIRouter()
# A worker's own `/drain` and `/resume`.
worker_router = APIRouter()


class DrainStatus(BaseModel):
    """A node's drain state."""

    instance_id: str | None
    draining: bool
    jobs_running: int


class DrainAction(BaseModel):
    """`POST orchestrator/drain`."""

    model_config = ConfigDict(extra="forbid")

    action: Literal["drain", "resume"]
    target: str | None = Field(default=None, min_length=1, max_length=64)


def _drain(request: Request) -> NodeDrain:
    drain = parts_of(request).get(DRAIN)
    if drain is None:
        raise ApiError(503, "unavailable", "the server is still starting; try again")
    return drain


def _is_self(request: Request, target: str | None) -> bool:
    return target is None or target == request.app.state.server.instance_id


def _unknown_target(target: str) -> ApiError:
    return ApiError(404, "unknown_target", f"no peer {target} is known to this coordinator")


@router.get("/orchestrator/drain", operation_id="orchestrator.drain_status", response_model=DrainStatus)
async def drain_status(
    request: Request,
    target: str | None = Query(None, min_length=1, max_length=64),
    _: Principal = Depends(require("peer.read")),
) -> dict[str, Any]:
    """This node's drain state, or a peer's as its last heartbeat said."""
    if _is_self(request, target):
        return _drain(request).status(request.app.state.server.instance_id)
    assert target is not None
    entry = started_hub(request).registry.get(target)
    if entry is None:
        raise _unknown_target(target)
    agents = entry.heartbeat.agents if entry.heartbeat else []
    return {
        "instance_id": target,
        "draining": entry.draining,
        "jobs_running": sum(agent.active_jobs for agent in agents),
    }


@router.post("/orchestrator/drain", operation_id="orchestrator.drain", response_model=DrainStatus)
async def drain_or_resume(
    body: DrainAction, request: Request, _: Principal = Depends(require("orchestrator.drain"))
) -> dict[str, Any]:
    """Drain or resume this coordinator, or a peer through `target` (forwarded as `peer.drain.request`)."""
    local = _is_self(request, body.target)
    if not local:
        assert body.target is not None
        hub = started_hub(request)
        require_connected(hub, body.target, known=hub.registry.get(body.target) is not None)
    # An action that changes no row: its access-log row is committed first (docs/design/admin.md §5).
    async with database(request).transaction() as conn:
        await log_write(
            request,
            conn,
            target_type="orchestrator",
            target_id=body.target or request.app.state.server.instance_id,
            status_code=200,
        )
    if local:
        drain = _drain(request)
        drain.apply(body.action)
        return drain.status(request.app.state.server.instance_id)
    return await _forward(started_hub(request), body)


async def _forward(hub: PeerHub, body: DrainAction) -> dict[str, Any]:
    assert body.target is not None
    request = DrainRequest(message_id=new_id(), action=body.action)
    answer = await ask_peer(hub, body.target, request, PEER_DRAIN_TIMEOUT_S, DrainResponse)
    return {"instance_id": body.target, "draining": answer.draining, "jobs_running": answer.jobs_running}


# --- a worker's own /drain and /resume


def _worker_action(request: Request, action: Literal["drain", "resume"]) -> JSONResponse:
    state = request.app.state.server
    expected = state.settings.worker_admin_token
    if not expected:
        return JSONResponse(
            {
                "error": "not_found",
                "detail": "this worker serves /drain and /resume only when CONVEYOR_WORKER_ADMIN_TOKEN is set",
            },
            status_code=404,
        )
    if not bearer_matches(request.headers.get("authorization"), expected):
        return JSONResponse(
            {
                "error": "unauthenticated",
                "detail": "send Authorization: Bearer <CONVEYOR_WORKER_ADMIN_TOKEN>",
            },
            status_code=401,
            headers={"WWW-Authenticate": "Bearer"},
        )
    drain = _drain(request)
    drain.apply(action, reason="worker admin token")
    return JSONResponse(drain.status(state.instance_id))


@worker_router.post("/drain", include_in_schema=False)
async def worker_drain(request: Request) -> JSONResponse:
    """Drain this worker (needs the worker admin token)."""
    return _worker_action(request, "drain")


@worker_router.post("/resume", include_in_schema=False)
async def worker_resume(request: Request) -> JSONResponse:
    """Resume this worker (needs the worker admin token)."""
    return _worker_action(request, "resume")
