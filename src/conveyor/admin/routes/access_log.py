"""`GET access-log`, `GET access-log/{id}` (permission `access_log.read`)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel

from conveyor.admin import store
from conveyor.admin.pagination import DEFAULT_LIMIT
from conveyor.http import Principal, database, require
from conveyor.http.paging import Page
from conveyor.model.errors import not_found

router = APIRouter()


class AccessRow(BaseModel):
    """One access-log row."""

    id: str
    at: datetime
    actor_type: str
    actor_id: str | None
    actor_label: str | None
    actor_role: str | None
    source: str
    action: str
    permission: str | None
    target_type: str | None
    target_id: str | None
    routing_key: str | None
    outcome: str
    status_code: int
    request_id: str | None
    remote_addr: str | None
    error: str | None


AccessPage = Page[AccessRow]


@router.get("/access-log", operation_id="access_log.list", response_model=AccessPage)
async def list_access_log(
    request: Request,
    actor_id: str | None = None,
    action: str | None = None,
    outcome: str | None = None,
    target_type: str | None = None,
    target_id: str | None = None,
    source: str | None = None,
    since: datetime | None = None,
    before: datetime | None = None,
    limit: int = Query(DEFAULT_LIMIT),
    cursor: str | None = None,
    _: Principal = Depends(require("access_log.read")),
) -> AccessPage:
    """Who did what, newest first."""
    filters: dict[str, Any] = {
        "actor_id": actor_id,
        "action": action,
        "outcome": outcome,
        "target_type": target_type,
        "target_id": target_id,
        "source": source,
        "since": since,
        "before": before,
    }
    async with database(request).read() as conn:
        rows, following = await store.page_access_log(conn, filters=filters, limit=limit, cursor=cursor)
    return AccessPage(
        items=[AccessRow(**{k: v for k, v in r.items() if k != "org_id"}) for r in rows],
        next_cursor=following,
    )


@router.get("/access-log/{row_id}", operation_id="access_log.show", response_model=AccessRow)
async def show_access_row(
    row_id: str, request: Request, _: Principal = Depends(require("access_log.read"))
) -> AccessRow:
    """One access-log row."""
    async with database(request).read() as conn:
        row = await store.get_access_row(conn, row_id)
    if row is None:
        raise not_found(f"access-log row {row_id}")
    return AccessRow(**{k: v for k, v in row.items() if k != "org_id"})
