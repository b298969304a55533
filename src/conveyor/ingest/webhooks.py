"""`POST /webhooks/{source_id}`: verify, store durably, answer 202; processing happens afterwards.

Every check runs before the insert, so a refused delivery writes nothing; the answer is sent only
after the row committed (in a commit it may share with concurrent deliveries: `batching.py`).
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from conveyor.ingest.pipeline import DeliveryHint
from conveyor.ingest.providers.base import InvalidRequest, ParsedDelivery
from conveyor.ingest.providers.parsing import (
    check_names,
    parse_generic,
    parse_git,
    parse_github,
    stored_headers,
)
from conveyor.ingest.service import IngestService, webhook_intake
from conveyor.ingest.signatures import verify_hmac, verify_token
from conveyor.ingest.store import NewDelivery
from conveyor.model.errors import ApiError, unavailable

router = APIRouter()

DEFAULT_SIGNATURE_HEADER = "x-hub-signature-256"


async def read_limited(request: Request, limit: int) -> bytes:
    """The raw body, refusing (413) as soon as it passes `limit` bytes."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, "payload_too_large", f"the body is larger than {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, "payload_too_large", f"the body is larger than {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


@router.post("/webhooks/{source_id}", include_in_schema=False)
async def receive_webhook(
    source_id: str, request: Request, service: IngestService = Depends(webhook_intake)
) -> Response:
    """Store a forge or generic webhook delivery."""
    source, secrets = await service.webhook_source(source_id)
    if source is None or not source.enabled:
        raise ApiError(404, "unknown_source", f"no enabled source {source_id}")
    if source.kind == "local":
        raise ApiError(400, "wrong_source_kind", "local sources are triggered with `source trigger-local`")
    body = await read_limited(request, await service.max_payload_bytes())
    headers = {k.lower(): v for k, v in request.headers.items()}
    header_name = (source.signature_header or DEFAULT_SIGNATURE_HEADER).lower()
    verify = "hmac" if source.kind == "github" else source.verify
    if verify == "hmac":
        ok = bool(secrets) and verify_hmac(headers.get(header_name), body, secrets)
    elif verify == "token":
        ok = bool(secrets) and verify_token(headers.get(header_name), secrets)
    else:
        ok = True
    if not ok:
        raise ApiError(401, "bad_signature", f"missing or wrong signature in {header_name}")
    try:
        parsed: ParsedDelivery
        if source.kind == "github":
            parsed = parse_github(headers, body)
        elif source.kind == "git":
            parsed = parse_git(headers, body)
        else:
            parsed = parse_generic(headers, body, source.event_header)
        check_names(parsed)
    except InvalidRequest as exc:
        raise ApiError(400, "invalid_request", str(exc)) from exc
    if parsed.event == "ping":
        return JSONResponse({"status": "pong"})
    try:
        # Group commit: concurrent deliveries share one durable commit; this returns once ours is in.
        row_id, created = await service.store_delivery(
            NewDelivery(
                source=source,
                delivery_id=parsed.delivery_id,
                event=parsed.event,
                action=parsed.action,
                headers=stored_headers(headers),
                body=body,
            )
        )
    except Exception as exc:
        raise unavailable("the delivery could not be stored") from exc
    if not created:
        return JSONResponse({"status": "duplicate", "delivery": row_id})
    return service.accepted(row_id, DeliveryHint(source, parsed, body))
