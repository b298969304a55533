"""Admin routes of agents, agent tokens and the dispatch queue (docs/design/admin.md §4 rows "agents" and
"queue").

Live sockets belong to the agent endpoint. The endpoint publishes, in `state.parts`, the hooks
these routes call when present: `agent_kicker(token_id)` after a token is revoked,
`agent_disconnector(agent_id)` for `POST agents/{id}/disconnect` (returning False when the agent is
not connected to this node), and `run_finalizer(run_ids)` after `queue/clear` cancelled jobs.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any

from fastapi import APIRouter, Depends, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from conveyor.admin.pagination import DEFAULT_LIMIT
from conveyor.agents import queue_store, store
from conveyor.agents.tokens import RESERVED_PREFIX, AgentTokenRow, normalise_labels
from conveyor.http import Principal, database, log_write, require
from conveyor.http.paging import Page
from conveyor.http.parts import parts_of
from conveyor.model.errors import ApiError, bad_request, conflict, not_found
from conveyor.model.ids import utc_now
from conveyor.parts import PartKey

log = logging.getLogger(__name__)

router = APIRouter()

# What the agents hook publishes for these routes (the cluster hook wraps the kicker to tell other coordinators).
KICKER = PartKey[Callable[[str], Awaitable[int]]]("agent_kicker")
"""Close this node's connections of an agent token (answers how many)."""
DISCONNECTOR = PartKey[Callable[[str], Awaitable[bool]]]("agent_disconnector")
"""Close one agent's connection (False when this node does not hold it)."""
RUN_FINALIZER = PartKey[Callable[[list[str]], Awaitable[None]]]("run_finalizer")
"""After `queue clear`: runs whose last jobs were cancelled take their conclusion."""

# A label is one word: no whitespace or commas (the CLI splits `--labels a,b` on commas).
_LABEL = re.compile(r"^[^\s,]{1,100}$")
QUEUE_STATES = ("pending", "claimed", "started")


# --- agent tokens


class AgentTokenCreate(BaseModel):
    """Body of `POST agent-tokens`."""

    model_config = ConfigDict(extra="forbid")
    label: str | None = Field(default=None, min_length=1, max_length=100)
    labels: list[str] = Field(default_factory=list, max_length=100)
    mandatory_labels: list[str] = Field(default_factory=list, max_length=100)
    expires_in_days: int | None = Field(default=None, ge=1, le=3650)


class AgentTokenOut(BaseModel):
    """An agent token's metadata: never its hash."""

    id: str
    label: str | None
    kind: str
    prefix: str
    labels: list[str]
    mandatory_labels: list[str]
    agent_id: str | None
    single_use: bool
    consumed_at: datetime | None
    created_by: str
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    last_used_at: datetime | None

    @classmethod
    def of(cls, row: AgentTokenRow) -> AgentTokenOut:
        """From the stored row."""
        fields = {k: v for k, v in row.__dict__.items() if k in cls.model_fields}
        return cls(**fields)


class AgentTokenCreated(AgentTokenOut):
    """The answer to `POST agent-tokens`: the only time the plaintext is shown."""

    token: str


class AgentTokenList(BaseModel):
    """`GET agent-tokens`."""

    items: list[AgentTokenOut]
    next_cursor: str | None = None


def _checked_labels(field_name: str, values: list[str]) -> list[str]:
    for value in values:
        if not _LABEL.match(value.strip()):
            raise ApiError(
                422,
                "invalid_body",
                f"{field_name}: {value!r} is not a label (1–100 characters, no spaces or commas)",
            )
    labels = normalise_labels(values)
    reserved = [label for label in labels if label.startswith(RESERVED_PREFIX)]
    if reserved:
        raise ApiError(
            422,
            "invalid_body",
            f"{field_name}: {', '.join(reserved)} is reserved (agents add conveyor:os, arch and host themselves)",
        )
    return labels


@router.post(
    "/agent-tokens", status_code=201, operation_id="agent_tokens.create", response_model=AgentTokenCreated
)
async def create_agent_token(
    body: AgentTokenCreate, request: Request, principal: Principal = Depends(require("agent.manage"))
) -> AgentTokenCreated:
    """Mint a static agent token; the plaintext is in this answer only."""
    labels = _checked_labels("labels", body.labels)
    mandatory = _checked_labels("mandatory_labels", body.mandatory_labels)
    missing = [label for label in mandatory if label not in labels]
    if missing:
        raise ApiError(422, "invalid_body", f"mandatory_labels: {', '.join(missing)} must also be in labels")
    expires_at = utc_now() + timedelta(days=body.expires_in_days) if body.expires_in_days else None
    async with database(request).transaction() as conn:
        plaintext, row = await store.mint_agent_token(
            conn,
            labels=labels,
            mandatory_labels=mandatory,
            label=body.label,
            created_by=principal.token_id,
            expires_at=expires_at,
        )
        await log_write(request, conn, target_type="agent_token", target_id=row.id, status_code=201)
    return AgentTokenCreated(**AgentTokenOut.of(row).model_dump(), token=plaintext)


@router.get("/agent-tokens", operation_id="agent_tokens.list", response_model=AgentTokenList)
async def list_agent_tokens(
    request: Request,
    limit: int = Query(DEFAULT_LIMIT),
    cursor: str | None = None,
    _: Principal = Depends(require("agent.read")),
) -> AgentTokenList:
    """Agent tokens' metadata, newest first (never a hash or a plaintext)."""
    async with database(request).read() as conn:
        rows, following = await store.page_agent_tokens(conn, limit=limit, cursor=cursor)
    return AgentTokenList(items=[AgentTokenOut.of(r) for r in rows], next_cursor=following)


@router.delete("/agent-tokens/{token_id}", status_code=204, operation_id="agent_tokens.revoke")
async def revoke_agent_token(
    token_id: str, request: Request, _: Principal = Depends(require("agent.manage"))
) -> Response:
    """Revoke a token at once; agents connected with it are then closed (4010) by the endpoint."""
    async with database(request).transaction() as conn:
        row = await store.get_agent_token(conn, token_id)
        if row is None:
            raise not_found(f"agent token {token_id}")
        if not await store.revoke_agent_token(conn, token_id, utc_now()):
            raise conflict("conflict", f"agent token {token_id} is already revoked")
        await log_write(request, conn, target_type="agent_token", target_id=token_id, status_code=204)
    kicker = parts_of(request).get(KICKER)
    if kicker is not None:
        try:
            await kicker(token_id)
        except Exception:  # the revocation stands; the endpoint refuses the token at the next auth
            log.exception("kicking the sockets of revoked agent token %s failed", token_id)
    return Response(status_code=204)


# --- agents


AgentPage = Page[dict[str, Any]]


@router.get("/agents", operation_id="agents.list", response_model=AgentPage)
async def list_agents(
    request: Request,
    label: str | None = None,
    limit: int = Query(DEFAULT_LIMIT),
    cursor: str | None = None,
    _: Principal = Depends(require("agent.read")),
) -> AgentPage:
    """Known agents (online, draining or offline), optionally those carrying `label`."""
    wanted = label.strip().lower() if label else None
    async with database(request).read() as conn:
        rows, following = await store.page_agents(conn, label=wanted, limit=limit, cursor=cursor)
    return AgentPage(items=rows, next_cursor=following)


@router.get("/agents/{agent_id}", operation_id="agents.show")
async def show_agent(
    agent_id: str, request: Request, _: Principal = Depends(require("agent.read"))
) -> dict[str, Any]:
    """One agent."""
    async with database(request).read() as conn:
        row = await store.get_agent(conn, agent_id)
    if row is None:
        raise not_found(f"agent {agent_id}")
    return row


@router.post("/agents/{agent_id}/disconnect", status_code=202, operation_id="agents.disconnect")
async def disconnect_agent(
    agent_id: str, request: Request, _: Principal = Depends(require("agent.manage"))
) -> dict[str, Any]:
    """Close an agent's connection with 4006 (it reconnects after its backoff)."""
    async with database(request).read() as conn:
        row = await store.get_agent(conn, agent_id)
    if row is None:
        raise not_found(f"agent {agent_id}")
    disconnector = parts_of(request).get(DISCONNECTOR)
    if row["state"] == "offline" or disconnector is None:
        raise conflict("conflict", "agent not connected to this node")
    # An action that changes no row: its access-log row is committed first (docs/design/admin.md §5).
    async with database(request).transaction() as conn:
        await log_write(request, conn, target_type="agent", target_id=agent_id, status_code=202)
    if await disconnector(agent_id) is False:
        raise conflict("conflict", "agent not connected to this node")
    return {"agent_id": agent_id, "status": "disconnecting"}


# --- queue


QueuePage = Page[dict[str, Any]]


class QueueClear(BaseModel):
    """Body of `POST queue/clear`."""

    model_config = ConfigDict(extra="forbid")
    confirm: bool


class QueueCleared(BaseModel):
    """What `POST queue/clear` cancelled."""

    cancelled: int
    job_ids: list[str]
    run_ids: list[str]


@router.get("/queue", operation_id="queue.list", response_model=QueuePage)
async def list_queue(
    request: Request,
    state: str | None = None,
    limit: int = Query(DEFAULT_LIMIT),
    cursor: str | None = None,
    _: Principal = Depends(require("run.read")),
) -> QueuePage:
    """Jobs waiting for or claimed by an agent, each with its `waiting: …` or `unschedulable: …` note."""
    if state is not None and state not in QUEUE_STATES:
        raise bad_request("invalid_request", f"state: must be one of {', '.join(QUEUE_STATES)}")
    states = (state,) if state else queue_store.LISTED_STATES
    async with database(request).read() as conn:
        rows, following = await queue_store.page_queue(conn, states=states, limit=limit, cursor=cursor)
    return QueuePage(items=rows, next_cursor=following)


@router.get("/queue/{job_id}", operation_id="queue.show")
async def show_queue_row(
    job_id: str, request: Request, _: Principal = Depends(require("run.read"))
) -> dict[str, Any]:
    """One queue row (keyed by its job id)."""
    async with database(request).read() as conn:
        row = await queue_store.get_queue_row(conn, job_id)
    if row is None:
        raise not_found(f"queue row for job {job_id}")
    return row


@router.post("/queue/clear", operation_id="queue.clear", response_model=QueueCleared)
async def clear_queue(
    body: QueueClear, request: Request, _: Principal = Depends(require("run.cancel"))
) -> QueueCleared:
    """Cancel every job still waiting in the queue (reason `admin_clear`); claimed jobs are left alone."""
    if not body.confirm:
        raise bad_request("invalid_request", "confirm: must be true to clear the queue")
    async with database(request).transaction() as conn:
        cleared = await queue_store.clear_queued_jobs(conn, utc_now())
        await log_write(request, conn, target_type="queue", target_id=None, status_code=200)
    finalizer = parts_of(request).get(RUN_FINALIZER)
    if finalizer is not None and cleared.run_ids:
        try:
            await finalizer(cleared.run_ids)
        except Exception:  # the jobs stay cancelled; concluding their runs is the dispatcher's to retry
            log.exception("concluding runs after queue clear failed")
    return QueueCleared(cancelled=len(cleared.job_ids), job_ids=cleared.job_ids, run_ids=cleared.run_ids)
