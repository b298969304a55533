"""`POST /api/v1/agents/claim` (docs/design/scaler.md §6.4): a provisioned machine redeems its claim code.

Unauthenticated: the single-use code is the credential. Attempts are throttled per remote address
(429 with `Retry-After`), and unknown, used and expired codes get the same 401, so the route tells
a guesser nothing. A redeemed code answers the agent id, its token (bound to that id and the
scaler's labels, valid `agent_token_ttl_ms`), the labels and the URL the agent dials.
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from conveyor.http.parts import parts_of
from conveyor.model.errors import ApiError, unavailable
from conveyor.model.ids import format_rfc3339, utc_now
from conveyor.scaler import claims
from conveyor.scaler.routes import SCALER

router = APIRouter()

CLAIM_PATH = "/api/v1/agents/claim"
# Bounded while it is read (`conveyor.http.inputs.InputGuard` is given this limit for CLAIM_PATH).
MAX_BODY_BYTES = 4096
THROTTLE_KEY = "scaler_claim_throttle"
REFUSED = "the claim code is unknown, already used or expired"


def _throttle(request: Request) -> claims.ClaimThrottle:
    found = getattr(request.app.state, THROTTLE_KEY, None)
    if not isinstance(found, claims.ClaimThrottle):
        found = claims.ClaimThrottle()
        setattr(request.app.state, THROTTLE_KEY, found)
    return found


def _code(raw: bytes) -> str:
    try:
        body: Any = json.loads(raw)
    except (ValueError, RecursionError):
        raise ApiError(400, "invalid_body", "the body must be a JSON object {claim_code}") from None
    code = body.get("claim_code") if isinstance(body, dict) else None
    if not isinstance(code, str) or not code:
        raise ApiError(400, "invalid_body", "claim_code: required, a string")
    return code


@router.post(CLAIM_PATH, include_in_schema=False)
async def claim(request: Request) -> JSONResponse:
    """Redeem a claim code for the spawn's agent token."""
    address = request.client.host if request.client is not None else "unknown"
    wait_s = _throttle(request).allow(address, time.monotonic())
    if wait_s is not None:
        raise ApiError(
            429,
            "rate_limited",
            "too many claim attempts from this address; retry later",
            headers={"Retry-After": str(max(1, math.ceil(wait_s)))},
        )
    raw = await request.body()
    if len(raw) > MAX_BODY_BYTES:
        raise ApiError(413, "payload_too_large", f"the body is larger than {MAX_BODY_BYTES} bytes")
    code = _code(raw)
    state = request.app.state.server
    manager = parts_of(request).get(SCALER)
    if manager is None:
        raise unavailable("the scaler is not running on this node")
    ttl_ms = await manager.knob("agent_token_ttl_ms", None)
    async with state.db.transaction() as conn:
        redeemed = await claims.redeem(conn, code, utc_now(), ttl_ms)
    if redeemed is None:
        raise ApiError(401, "invalid_claim", REFUSED)
    return JSONResponse(
        {
            "agent_id": redeemed.agent_id,
            "token": redeemed.token,
            "url": redeemed.url,
            "labels": redeemed.labels,
            "expires_at": format_rfc3339(redeemed.expires_at),
            "agent_token_ttl_ms": ttl_ms,
        }
    )
