"""HTTP surfaces of the cluster: `/ws/peer`, the admin peer routes, and `GET /cluster/health`.

Admin (docs/design/cluster.md §7.3, docs/design/admin.md §4): `GET peers` (`peer.read`),
`POST peers/join-tokens` and `POST peers/{instance_id}/revoke` (`peer.manage`). `/cluster/health` answers only
`{"status"}` unless the caller presents a live admin token whose role has `peer.read`
(docs/design/cluster.md §8).
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from typing import Any, Literal

from fastapi import APIRouter, Depends, Request, WebSocket
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from conveyor.admin.store import find_token_by_hash
from conveyor.admin.tokens import hash_token, looks_like_admin_token
from conveyor.cluster import store
from conveyor.cluster.auth import (
    JOIN_TOKEN_DEFAULT_TTL_MS,
    hash_join_token,
    join_token_ttl_problem,
    new_join_token,
)
from conveyor.cluster.forget import PeerForgetter, forget_status_code
from conveyor.cluster.service import PeerHub
from conveyor.db.engine import check_reachable
from conveyor.http import Principal, database, log_write, require
from conveyor.http.parts import parts_of
from conveyor.model.errors import ApiError, bad_request, not_found
from conveyor.model.ids import format_rfc3339, utc_now
from conveyor.model.permissions import role_allows
from conveyor.parts import PartKey

log = logging.getLogger(__name__)

PEER_HUB = PartKey[PeerHub]("peer_hub")
FORGETTER = PartKey[PeerForgetter]("peer_forgetter")

# Admin routes (mounted under /api/v1/admin).
router = APIRouter()
# `/ws/peer`: coordinators only (a worker does not mount it).
socket_router = APIRouter()
# `/cluster/health`: every node.
health_router = APIRouter()
# A worker's `/ws/peer`: answers 404 (docs/design/cluster.md §1: only coordinators accept peers).
worker_socket_router = APIRouter()


def started_hub(request: Request) -> PeerHub:
    """The request's node's peer hub; 503 while the server is still starting."""
    hub = parts_of(request).get(PEER_HUB)
    if hub is None:
        raise ApiError(503, "unavailable", "the server is still starting; try again")
    return hub


@socket_router.websocket("/ws/peer")
async def peer_socket(websocket: WebSocket) -> None:
    """Hand the connection to this coordinator's peer hub."""
    hub = parts_of(websocket).get(PEER_HUB)
    if hub is None or hub.authenticator is None:
        await websocket.close(code=1013, reason="not ready")
        return
    await hub.accept(websocket)


@worker_socket_router.websocket("/ws/peer")
async def no_peer_socket_on_a_worker(websocket: WebSocket) -> None:
    """Refuse the upgrade with HTTP 404: a worker is not a coordinator."""
    body = {"error": "not_found", "detail": "this node is a worker; only coordinators accept /ws/peer"}
    try:
        await websocket.send_denial_response(JSONResponse(body, status_code=404))
    except RuntimeError:  # a server without the denial extension: close before accepting
        await websocket.close(code=1008)


# --- admin


class PeerOut(BaseModel):
    """One peer as `peer list` shows it."""

    instance_id: str
    role: str
    connected: bool
    draining: bool
    # It shut down cleanly (said `peer.leaving`) and has not connected since.
    left: bool
    last_heartbeat_at: str | None
    applied_settings_version: int
    credential_created_at: str | None
    credential_expires_at: str | None
    credential_revoked_at: str | None
    # Its scalers (not retiring) as its last heartbeat listed them: what it runs now, e.g. after a shared
    # scaler configuration reached it (docs/design/scaler.md §11).
    scalers: list[str] = []


class PeerList(BaseModel):
    """`GET peers`: every peer in the registry, with its credential (not paged: a cluster is small)."""

    items: list[PeerOut]
    next_cursor: str | None = None


class JoinTokenCreate(BaseModel):
    """`POST peers/join-tokens`."""

    model_config = ConfigDict(extra="forbid")

    role: Literal["coordinator", "worker"]
    expires_in_ms: int | None = None


class JoinTokenCreated(BaseModel):
    """The new token, shown once."""

    id: str
    token: str
    expires_at: str


class PeerRevoked(BaseModel):
    """`POST peers/{instance_id}/revoke`."""

    instance_id: str
    revoked_credentials: int
    sessions_closed: int


def _at(value: Any) -> str | None:
    return format_rfc3339(value) if value is not None else None


@router.get("/peers", operation_id="peers.list", response_model=PeerList)
async def list_peers(request: Request, _: Principal = Depends(require("peer.read"))) -> PeerList:
    """The registry's peers (connection, heartbeat, settings version) joined with their credentials.

    The registry, not the credential table, says who is listed: a peer is listed from its first
    session here (or, for a coordinator, from its `cluster_instances` row) until it is forgotten;
    forgetting never touches credentials (docs/design/cluster.md §7.1).
    """
    hub = started_hub(request)
    async with database(request).read() as conn:
        credentials = await store.credentials_by_instance(conn)
    items = []
    for entry in hub.registry.entries():
        if entry.instance_id == hub.identity.instance_id:
            continue
        credential = credentials.get(entry.instance_id)
        items.append(
            PeerOut(
                instance_id=entry.instance_id,
                role=entry.role,
                connected=entry.connected,
                draining=entry.draining,
                left=entry.left,
                last_heartbeat_at=_at(entry.last_heartbeat_at),
                applied_settings_version=entry.applied_settings_version,
                credential_created_at=_at(credential.created_at) if credential else None,
                credential_expires_at=_at(credential.expires_at) if credential else None,
                credential_revoked_at=_at(credential.revoked_at) if credential else None,
                scalers=[scaler.name for scaler in entry.heartbeat.scalers] if entry.heartbeat else [],
            )
        )
    return PeerList(items=items)


@router.post(
    "/peers/join-tokens", status_code=201, operation_id="peers.join_token", response_model=JoinTokenCreated
)
async def create_join_token(
    body: JoinTokenCreate, request: Request, principal: Principal = Depends(require("peer.manage"))
) -> JoinTokenCreated:
    """A one-time `cvy_join_` token for a new peer; the plaintext is in this answer only."""
    expires_in_ms = body.expires_in_ms if body.expires_in_ms is not None else JOIN_TOKEN_DEFAULT_TTL_MS
    problem = join_token_ttl_problem(expires_in_ms)
    if problem:
        raise bad_request("out_of_range", problem)
    token = new_join_token()
    async with database(request).transaction() as conn:
        now = await store.database_now(conn)
        expires_at = now + timedelta(milliseconds=expires_in_ms)
        token_id = await store.insert_join_token(
            conn,
            token_hash=hash_join_token(token),
            role=body.role,
            created_by=principal.token_id,
            now=now,
            expires_at=expires_at,
        )
        await log_write(request, conn, target_type="join_token", target_id=token_id, status_code=201)
    return JoinTokenCreated(id=token_id, token=token, expires_at=format_rfc3339(expires_at))


@router.post("/peers/{instance_id}/revoke", operation_id="peers.revoke", response_model=PeerRevoked)
async def revoke_peer(
    instance_id: str, request: Request, _: Principal = Depends(require("peer.manage"))
) -> PeerRevoked:
    """Revoke the peer's credentials, close its sessions here (4403) and have sibling coordinators close theirs."""
    hub = started_hub(request)
    async with database(request).transaction() as conn:
        if not await store.credential_known(conn, instance_id):
            raise not_found(f"peer {instance_id}")
        revoked = await store.revoke_credentials(conn, instance_id, await store.database_now(conn))
        await log_write(request, conn, target_type="peer", target_id=instance_id, status_code=200)
    closed = await hub.revoke(instance_id)
    log.info(
        "peer %s revoked", instance_id, extra={"revoked_credentials": revoked, "sessions_closed": closed}
    )
    return PeerRevoked(instance_id=instance_id, revoked_credentials=revoked, sessions_closed=closed)


class ForgetBody(BaseModel):
    """`POST peers/forget` (docs/design/cluster.md §7.1)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    instance_id: str = Field(min_length=1, max_length=64)
    timeout_ms: int = Field(default=10_000, ge=100, le=60_000)
    acknowledge_backstop: bool = False


class ForgetResultOut(BaseModel):
    """One coordinator's outcome."""

    coordinator: str
    outcome: str
    detail: str


class ForgetOut(BaseModel):
    """Every answer, this coordinator's first."""

    instance_id: str
    results: list[ForgetResultOut]


def _forget_body(raw: Any) -> ForgetBody:
    """The body, or 400 naming what is wrong (docs/design/cluster.md §7.1: bad input is 400, not the
    generic 422)."""
    if not isinstance(raw, dict):
        raise bad_request("invalid_request", "the body must be a JSON object")
    try:
        return ForgetBody.model_validate(raw)
    except ValidationError as exc:
        detail = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'body'}: "
            + ("is not a known field" if err["type"] == "extra_forbidden" else err["msg"])
            for err in exc.errors()
        )
        raise bad_request("invalid_request", detail) from exc


@router.post(
    "/peers/forget",
    operation_id="peers.forget",
    response_model=ForgetOut,
    responses={409: {"description": "a coordinator wants the scaler backstop acknowledged"}},
)
async def forget_peer(request: Request, _: Principal = Depends(require("peer.manage"))) -> JSONResponse:
    """Forget a departed peer here and on every connected sibling coordinator (docs/design/cluster.md §7)."""
    try:
        raw = await request.json()
    except ValueError as exc:
        raise bad_request("invalid_request", "the body must be a JSON object") from exc
    body = _forget_body(raw)
    forgetter = parts_of(request).get(FORGETTER)
    if forgetter is None:
        raise ApiError(503, "unavailable", "the server is still starting; try again")
    results = await forgetter.forget(
        body.instance_id, acknowledged=body.acknowledge_backstop, timeout_ms=body.timeout_ms
    )
    out = ForgetOut(
        instance_id=body.instance_id,
        results=[
            ForgetResultOut(coordinator=r.coordinator, outcome=r.outcome, detail=r.detail) for r in results
        ],
    ).model_dump()
    async with database(request).transaction() as conn:
        status = forget_status_code([r.outcome for r in results])
        await log_write(request, conn, target_type="peer", target_id=body.instance_id, status_code=status)
    if status == 409:
        refusal = next(r for r in results if r.outcome == "backstop-acknowledgement-required")
        return JSONResponse(
            {
                "error": "acknowledgement_required",
                "detail": refusal.detail,
                "acknowledgement_required": True,
                **out,
            },
            status_code=409,
        )
    return JSONResponse(out)


# --- /cluster/health


async def _may_read_peers(request: Request) -> bool:
    """Whether the caller presents a live admin token with `peer.read` (never raises)."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not looks_like_admin_token(token):
        return False
    db = getattr(request.app.state, "db", None)
    if db is None or request.app.state.server.settings.cluster_role != "coordinator":
        return False
    try:
        async with db.read() as conn:
            row = await find_token_by_hash(conn, hash_token(token))
    except Exception:
        return False
    return row is not None and row.is_live(utc_now()) and role_allows(row.role, "peer.read")


def health_status(*, database_ok: bool | None, known: int, connected: int, lease_live: bool | None) -> str:
    """`healthy` | `degraded` | `down` (docs/design/cluster.md §8): coordinators pass `database_ok` and
    `lease_live`."""
    if database_ok is None:  # a worker: only its coordinators count
        if known and connected == known:
            return "healthy"
        return "degraded" if connected else "down"
    if not database_ok:
        return "down"
    return "healthy" if connected == known and lease_live else "degraded"


@health_router.get("/cluster/health", include_in_schema=False)
async def cluster_health(request: Request) -> JSONResponse:
    """Status for everyone; the instance, lease and peers for callers with `peer.read`."""
    state = request.app.state.server
    hub = parts_of(request).get(PEER_HUB)
    coordinator = state.settings.cluster_role == "coordinator"
    now_mono = time.monotonic()
    body: dict[str, Any] = {}
    lease: dict[str, Any] | None = None
    if coordinator:
        from conveyor.runtime import store as runtime_store

        database_ok = True
        lease_live = False
        try:
            await check_reachable(state.db, state.settings.ready_db_timeout_ms / 1000)
            async with state.db.read() as conn:
                row = await runtime_store.read_lease(conn)
                now = await runtime_store.database_now(conn)
            if row is not None:
                lease_live = row.expires_at > now
                lease = {
                    "holder": row.holder,
                    "epoch": row.epoch,
                    "expires_at": format_rfc3339(row.expires_at),
                }
        except Exception:
            database_ok = False
        entries = hub.registry.entries() if hub else []
        # A peer that left cleanly is gone, not missing: it does not degrade the coordinator.
        present = [e for e in entries if not e.left]
        status = health_status(
            database_ok=database_ok,
            known=len(present),
            connected=sum(1 for e in present if e.connected),
            lease_live=lease_live,
        )
    else:
        entries = hub.registry.entries() if hub else []
        known = len(hub.coordinator_urls) if hub else 0
        status = health_status(
            database_ok=None, known=known, connected=len(hub.connected()) if hub else 0, lease_live=None
        )
    body["status"] = status
    if await _may_read_peers(request):
        body.update(
            instance_id=state.instance_id,
            role=state.settings.cluster_role,
            lease=lease,
            peers=[
                {
                    "instance_id": e.instance_id,
                    "role": e.role,
                    "connected": e.connected,
                    "draining": e.draining,
                    "left": e.left,
                    "last_heartbeat_age_ms": e.heartbeat_age_ms(now_mono),
                }
                for e in entries
            ],
        )
    return JSONResponse(body, status_code=503 if status == "down" else 200)
