"""`POST /api/v1/admin/support-bundle` (`support_bundle.create`, docs/design/admin.md §8.1): every named
node's part, written into one streamed tar.gz as each arrives, the manifest last."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from conveyor.cluster.forwarding import ALL_NODES, NoAnswer, ask_in_fan_out, target_nodes
from conveyor.cluster.messages import SupportBundleRequest, SupportBundleResponse
from conveyor.cluster.routes import PEER_HUB
from conveyor.cluster.service import PeerHub
from conveyor.http import Principal, database, log_write, require
from conveyor.http.parts import parts_of
from conveyor.model.errors import ApiError
from conveyor.model.ids import format_rfc3339, utc_now
from conveyor.server.support_bundle import (
    FILE_CAP_BYTES,
    LOG_BYTES_DEFAULT,
    LOG_BYTES_MAX,
    LOG_BYTES_MIN,
    LOG_FILE,
    NodeRedactor,
    TarStream,
    cap_text,
    json_file,
    manifest,
    node_entry,
)
from conveyor.server.support_node import SUPPORT_PART, NodePart

router = APIRouter()

TIMEOUT_MIN_MS, TIMEOUT_MAX_MS, TIMEOUT_DEFAULT_MS = 1_000, 60_000, 15_000
# The files a node's answer may hold; anything else a peer sends is left out of the archive.
NODE_FILES = frozenset({"node.json", "settings.json", "scaler.json", "peers.json", "database.json", LOG_FILE})

Collected = tuple[dict[str, Any], dict[str, str]]


class SupportBundleBody(BaseModel):
    """Body of `POST support-bundle` (none: the answering coordinator, 1 MiB of log)."""

    model_config = ConfigDict(extra="forbid")
    target: str | None = Field(default=None, min_length=1, max_length=64)
    log_bytes: int | None = None
    timeout_ms: int | None = None


def _check(body: SupportBundleBody) -> None:
    if body.log_bytes is not None and not LOG_BYTES_MIN <= body.log_bytes <= LOG_BYTES_MAX:
        raise ApiError(
            400, "invalid_request", f"log_bytes: must be between {LOG_BYTES_MIN} and {LOG_BYTES_MAX}"
        )
    if body.timeout_ms is not None and not TIMEOUT_MIN_MS <= body.timeout_ms <= TIMEOUT_MAX_MS:
        raise ApiError(
            400, "invalid_request", f"timeout_ms: must be between {TIMEOUT_MIN_MS} and {TIMEOUT_MAX_MS}"
        )


def accepted_files(files: Mapping[str, str], log_bytes: int) -> dict[str, str]:
    """A peer's files as the archive takes them: the expected names only, bounded again, and token-shaped
    strings redacted again (the node redacted them first; this is the second look)."""
    redactor = NodeRedactor(())
    return {
        name: redactor.text(cap_text(content, log_bytes + 1024 if name == LOG_FILE else FILE_CAP_BYTES))
        for name, content in files.items()
        if name in NODE_FILES
    }


async def ask_node(hub: PeerHub, node: str, role: str, log_bytes: int, timeout_s: float) -> Collected:
    """One other node's manifest entry and files; what does not answer in time is `unreachable`."""
    request = SupportBundleRequest(message_id=uuid.uuid4().hex, log_bytes=log_bytes)
    answer = await ask_in_fan_out(hub, node, request, timeout_s, SupportBundleResponse)
    if isinstance(answer, NoAnswer):
        return node_entry(node, role, answer.outcome, answer.detail), {}
    if not answer.ok:
        return node_entry(node, role, "refused", answer.error or "refused"), {}
    files = accepted_files(answer.files, log_bytes)
    return node_entry(node, role, "collected", "", files), files


async def collect_here(collect: NodePart, me: str, log_bytes: int) -> Collected:
    """This node's entry and files."""
    try:
        files = await collect(log_bytes)
    except Exception as exc:  # the rest of the bundle is still worth having
        return node_entry(me, "coordinator", "refused", f"{type(exc).__name__}: {exc}"), {}
    return node_entry(me, "coordinator", "collected", "", files), files


async def bundle_stream(
    *,
    hub: PeerHub,
    collect: NodePart,
    target: str | None,
    others: list[tuple[str, str]],
    log_bytes: int,
    timeout_s: float,
) -> AsyncIterator[bytes]:
    """The archive: this node's files (when named), each other node's as its answer arrives, the manifest."""
    me = hub.identity.instance_id
    created_at = format_rfc3339(utc_now())
    tar = TarStream()
    asks = [asyncio.create_task(ask_node(hub, node, role, log_bytes, timeout_s)) for node, role in others]
    pending: list[asyncio.Future[Collected]] = list(asks)
    if target in (None, me, ALL_NODES):
        here = asyncio.get_running_loop().create_future()
        here.set_result(await collect_here(collect, me, log_bytes))
        pending.insert(0, here)
    entries: list[dict[str, Any]] = []
    try:
        for arrived in asyncio.as_completed(pending):
            entry, files = await arrived
            for name in sorted(files):
                tar.add(f"{entry['node']}/{name}", files[name])
            entries.append(entry)
            yield tar.take()
        document = manifest(created_at=created_at, target=target, log_bytes=log_bytes, me=me, entries=entries)
        tar.add("manifest.json", json_file(document))
        yield tar.close()
    finally:
        for task in asks:
            task.cancel()


@router.post("/support-bundle", operation_id="support_bundle.create")
async def create_support_bundle(
    request: Request,
    body: SupportBundleBody | None = None,
    _: Principal = Depends(require("support_bundle.create")),
) -> StreamingResponse:
    """A tar.gz of every named node's recent logs, version, settings (redacted), scaler, peer and database
    status."""
    body = body or SupportBundleBody()
    _check(body)
    parts = parts_of(request)
    hub, collect = parts.get(PEER_HUB), parts.get(SUPPORT_PART)
    if hub is None or collect is None:
        raise ApiError(503, "unavailable", "the node has not finished starting")
    others = await target_nodes(hub, database(request), body.target) if body.target else []
    # An action that changes no row: its access-log row is committed first (docs/design/admin.md §5).
    async with database(request).transaction() as conn:
        await log_write(request, conn, target_type="support_bundle", target_id=body.target, status_code=200)
    stamp = utc_now().strftime("%Y%m%dT%H%M%SZ")
    return StreamingResponse(
        bundle_stream(
            hub=hub,
            collect=collect,
            target=body.target,
            others=others,
            log_bytes=body.log_bytes or LOG_BYTES_DEFAULT,
            timeout_s=(body.timeout_ms or TIMEOUT_DEFAULT_MS) / 1000,
        ),
        media_type="application/gzip",
        headers={"Content-Disposition": f'attachment; filename="conveyor-support-{stamp}.tar.gz"'},
    )
