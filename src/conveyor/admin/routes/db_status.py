"""`GET db/status` (permission `cluster_settings.read`): the schema revision against this build."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel

from conveyor.db.migrate import status_on
from conveyor.http import Principal, database, require

router = APIRouter()


class DbStatus(BaseModel):
    """Where the schema stands."""

    dialect: str
    current: str | None
    head: str
    state: str


@router.get("/db/status", operation_id="db.status", response_model=DbStatus)
async def db_status(request: Request, _: Principal = Depends(require("cluster_settings.read"))) -> DbStatus:
    """Current and head revisions."""
    db = database(request)
    async with db.read() as conn:
        status = await conn.run_sync(status_on)
    return DbStatus(dialect=db.dialect, current=status.current, head=status.head, state=status.state)
