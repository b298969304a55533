"""A node's part of a support bundle (docs/design/admin.md §8.1): collected from what the running server
holds, redacted and bounded here, before it leaves the node; and the answer to a coordinator's
`peer.support_bundle.request`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import platform
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

from conveyor.cluster.auth import load_credential
from conveyor.cluster.messages import SupportBundleRequest, SupportBundleResponse
from conveyor.cluster.orphans import COORDINATORS_ONLY
from conveyor.cluster.peer import PeerSession
from conveyor.cluster.routes import PEER_HUB
from conveyor.cluster.service import PeerHub
from conveyor.cluster.snapshot import SETTINGS_SNAPSHOT
from conveyor.cluster.startup import WORKER
from conveyor.db.engine import check_reachable
from conveyor.db.migrate import status_on
from conveyor.model.ids import format_rfc3339, utc_now
from conveyor.parts import PartKey
from conveyor.runtime.node import Component
from conveyor.scaler.routes import SCALER
from conveyor.server.log_ring import log_ring
from conveyor.server.state import ServerState
from conveyor.server.support_bundle import (
    NodeRedactor,
    bound_part,
    json_file,
    redact_settings,
    secret_setting_values,
)
from conveyor.version import COMMIT, VERSION

log = logging.getLogger(__name__)

# This node's part: `await collect(log_bytes)` → {file name: text}, redacted and bounded.
NodePart = Callable[[int], Awaitable[dict[str, str]]]
SUPPORT_PART = PartKey[NodePart]("support_part")
DATABASE_TIMEOUT_S = 5.0


def _node_file(state: ServerState) -> dict[str, Any]:
    now = utc_now()
    uptime = time.monotonic() - state.started_monotonic
    return {
        "instance_id": state.instance_id,
        "role": state.settings.cluster_role,
        "version": VERSION,
        "commit": COMMIT,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "pid": os.getpid(),
        "started_at": format_rfc3339(now - timedelta(seconds=uptime)),
        "uptime_s": round(uptime, 3),
        "collected_at": format_rfc3339(now),
    }


async def _cluster_settings(state: ServerState) -> dict[str, Any] | None:
    """The fleet knobs this node applies: a coordinator's row, a worker's snapshot."""
    snapshot = state.parts.get(SETTINGS_SNAPSHOT)
    if snapshot is not None:
        current = snapshot.current()
        return {"version": current.version, "served_by": current.served_by, "values": dict(current.settings)}
    if state.settings.cluster_role != "coordinator":
        return None
    from conveyor.runtime.boot import runtime_services

    view = await runtime_services(state.parts).settings.cluster()
    return {"version": view.version, "stored": dict(view.stored), "effective": dict(view.effective)}


def _peers(hub: PeerHub | None) -> dict[str, Any]:
    if hub is None:
        return {"peers": [], "detail": "the peer channel has not started on this node"}
    now = hub.clock()
    return {
        "connected": hub.connected(),
        "peers": [
            {
                "instance_id": entry.instance_id,
                "role": entry.role,
                "connected": entry.connected,
                "draining": entry.draining,
                "left": entry.left,
                "last_heartbeat_at": format_rfc3339(entry.last_heartbeat_at)
                if entry.last_heartbeat_at
                else None,
                "last_heartbeat_age_ms": entry.heartbeat_age_ms(now),
                "applied_settings_version": entry.applied_settings_version,
                "software_version": entry.software_version,
            }
            for entry in hub.registry.entries()
        ],
        "coordinator_urls": list(hub.coordinator_urls),
        "refusals": dict(hub.refusals),
    }


async def _database(state: ServerState) -> dict[str, Any]:
    if state.settings.cluster_role != "coordinator":
        return {"database": None, "detail": "a worker has no database"}
    db = state.db
    report: dict[str, Any] = {"database": db.dialect}
    started = time.monotonic()
    try:
        await check_reachable(db, DATABASE_TIMEOUT_S)
        async with db.read() as conn:
            schema = await conn.run_sync(status_on)
    except Exception as exc:  # the report says what failed; the bundle is still made
        report.update(reachable=False, error=f"{type(exc).__name__}: {exc}")
        return report
    report.update(
        reachable=True,
        latency_ms=round((time.monotonic() - started) * 1000, 1),
        schema={"current": schema.current, "head": schema.head, "state": schema.state},
    )
    return report


def _secret_values(state: ServerState, settings: dict[str, Any]) -> list[str]:
    """What this node must never send: its secret settings, its peer credential, its held jobs' secrets."""
    values = secret_setting_values(settings)
    if state.instance_id:
        saved = load_credential(state.settings.home, state.instance_id)
        if saved is not None:
            values += [saved.secret, *([saved.previous_secret] if saved.previous_secret else [])]
    worker = state.parts.get(WORKER)
    if worker is not None:
        for job in worker.jobs.values():
            values += job.secret_values()
    return values


async def collect_part(state: ServerState, log_bytes: int) -> dict[str, str]:
    """This node's files, redacted and within the bundle's bounds."""
    settings = state.settings.model_dump(mode="json")
    scaler = state.parts.get(SCALER)
    files = {
        "node.json": json_file(_node_file(state)),
        "settings.json": json_file(
            {"process": redact_settings(settings), "cluster": await _cluster_settings(state)}
        ),
        "scaler.json": json_file(
            {"node": state.instance_id, "scalers": scaler.status() if scaler is not None else None}
        ),
        "peers.json": json_file(_peers(state.parts.get(PEER_HUB))),
        "database.json": json_file(await _database(state)),
    }
    redactor = NodeRedactor(_secret_values(state, settings))
    lines = await asyncio.to_thread(lambda: [redactor.text(line) for line in log_ring().lines()])
    return bound_part(
        redactor.redact(files),
        lines,
        log_bytes=log_bytes,
        frame_bytes=state.settings.ws_max_message_bytes,
    )


def install_support_answers(hub: PeerHub, collect: NodePart) -> None:
    """Answer coordinators' `peer.support_bundle.request` with this node's part."""

    async def answer(session: PeerSession, message: SupportBundleRequest) -> SupportBundleResponse:
        me = hub.identity.instance_id
        if session.peer_role != "coordinator":
            log.warning("refused a support bundle request from %s (%s)", session.peer_id, session.peer_role)
            return SupportBundleResponse(
                message_id=message.message_id, node=me, ok=False, error=COORDINATORS_ONLY
            )
        files = await collect(message.log_bytes)
        log.info("sent this node's part of a support bundle to %s", session.peer_id)
        return SupportBundleResponse(message_id=message.message_id, node=me, ok=True, files=files)

    hub.handle("peer.support_bundle.request", answer)


async def start(state: ServerState) -> list[Component]:
    """Start-up hook (coordinators and workers, after the peer hub): publish this node's part for the
    route, and answer coordinators asking for it."""

    async def collect(log_bytes: int) -> dict[str, str]:
        return await collect_part(state, log_bytes)

    state.parts.put(SUPPORT_PART, collect)
    hub = state.parts.get(PEER_HUB)
    if hub is not None:
        install_support_answers(hub, collect)
    return []
