"""Admin tokens: `POST/GET tokens`, `DELETE tokens/{id}` (permission `token.manage`)."""

from __future__ import annotations

from datetime import datetime, timedelta

from fastapi import APIRouter, Depends, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from conveyor.admin import store
from conveyor.admin.store import TokenRow
from conveyor.http import Principal, database, log_write, require
from conveyor.model.errors import ApiError, conflict, not_found
from conveyor.model.ids import utc_now
from conveyor.model.permissions import Role

router = APIRouter()


class TokenCreate(BaseModel):
    """Body of `POST tokens`."""

    model_config = ConfigDict(extra="forbid")
    label: str | None = Field(default=None, min_length=1, max_length=100)
    role: Role
    routing_key: str | None = Field(default=None, min_length=1, max_length=255)
    expires_in_days: int | None = Field(default=None, ge=1, le=3650)


class TokenOut(BaseModel):
    """A token's metadata: never its hash."""

    id: str
    prefix: str
    label: str | None
    role: str
    routing_key: str | None
    created_by: str
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    last_used_at: datetime | None

    @classmethod
    def of(cls, row: TokenRow) -> TokenOut:
        """From the stored row."""
        return cls(**row.__dict__)


class TokenCreated(TokenOut):
    """The answer to `POST tokens`: the only time the plaintext is shown."""

    token: str


class TokenList(BaseModel):
    """`GET tokens`."""

    items: list[TokenOut]
    next_cursor: str | None = None


@router.post("/tokens", status_code=201, operation_id="tokens.create", response_model=TokenCreated)
async def create_token(
    body: TokenCreate, request: Request, principal: Principal = Depends(require("token.manage"))
) -> TokenCreated:
    """Mint an admin token; the plaintext is in this answer only."""
    expires_at = utc_now() + timedelta(days=body.expires_in_days) if body.expires_in_days else None
    async with database(request).transaction() as conn:
        plaintext, row = await store.insert_token(
            conn,
            role=body.role,
            created_by=principal.token_id,
            label=body.label,
            routing_key=body.routing_key,
            expires_at=expires_at,
        )
        await log_write(request, conn, target_type="admin_token", target_id=row.id, status_code=201)
    return TokenCreated(**TokenOut.of(row).model_dump(), token=plaintext)


@router.get("/tokens", operation_id="tokens.list", response_model=TokenList)
async def list_tokens(request: Request, _: Principal = Depends(require("token.manage"))) -> TokenList:
    """Every admin token's metadata, newest first."""
    async with database(request).read() as conn:
        rows = await store.list_tokens(conn)
    return TokenList(items=[TokenOut.of(r) for r in rows])


@router.delete("/tokens/{token_id}", status_code=204, operation_id="tokens.revoke")
async def revoke_token(
    token_id: str, request: Request, _: Principal = Depends(require("token.manage"))
) -> Response:
    """Revoke a token at once; the last live owner token cannot be revoked."""
    now = utc_now()
    async with database(request).transaction() as conn:
        row = await store.get_token(conn, token_id)
        if row is None:
            raise not_found(f"token {token_id}")
        if row.revoked_at is not None:
            raise conflict("conflict", f"token {token_id} is already revoked")
        if row.role == "owner" and row.is_live(now) and await store.count_live_owners(conn, now) <= 1:
            raise conflict("last_owner", "this is the last live owner token; create another owner first")
        if not await store.revoke_token(conn, token_id, now):
            raise ApiError(409, "conflict", f"token {token_id} changed concurrently; try again")
        await log_write(request, conn, target_type="admin_token", target_id=token_id, status_code=204)
    return Response(status_code=204)
