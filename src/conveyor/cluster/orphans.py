"""Orphans on other nodes (docs/design/scaler.md §7): a coordinator forwards
`scaler orphans list|stop --target`.

The node that runs the processes lists and stops them (`scaler.orphans.Orphans`); the coordinator adds
what only it can see — the dispatch bindings and the online agents in the shared database, and its
own view of disconnected coordinators — and never forwards a stop for an item bound to a live job.
A node answers `peer.scaler.orphans.request` only from a peer whose credential role is `coordinator`.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from conveyor.cluster.forwarding import ask_peer, require_connected
from conveyor.cluster.messages import OrphansRequest, OrphansResponse
from conveyor.cluster.peer import PeerSession
from conveyor.cluster.service import PeerHub
from conveyor.db.engine import Database
from conveyor.model.errors import ApiError
from conveyor.model.ids import utc_now
from conveyor.runtime import store as runtime_store
from conveyor.scaler import store as scaler_store
from conveyor.scaler.orphans import Facts, dedupe_ids, stale_coordinators

log = logging.getLogger(__name__)

COORDINATORS_ONLY = "accepted from coordinators only"


def overlay_coordinator_view(
    items: Iterable[Mapping[str, Any]],
    *,
    bindings: Mapping[str, str],
    online: Mapping[str, str | None],
    disconnected: bool,
) -> list[dict[str, Any]]:
    """A node's listing with the coordinator's trackers added (pure).

    An item whose agent the shared database binds to a live job gains `job`; one whose agent is online
    with a coordinator gains `registered`. An item still untracked reads `unknown` while this
    coordinator sees a disconnected coordinator (its owner may sit behind the partition).
    """
    out: list[dict[str, Any]] = []
    for item in items:
        entry = dict(item)
        tracked_by = list(entry.get("tracked_by") or [])
        agent_id = entry.get("agent_id")
        if agent_id is not None and agent_id in bindings:
            if "job" not in tracked_by:
                tracked_by.append("job")
            entry["job_id"] = entry.get("job_id") or bindings[agent_id]
        if agent_id is not None and agent_id in online:
            if "registered" not in tracked_by:
                tracked_by.append("registered")
            entry["registered_with"] = entry.get("registered_with") or online[agent_id]
        entry["tracked_by"] = tracked_by
        if tracked_by:
            entry["state"] = "tracked"
        elif disconnected and entry.get("state") == "untracked":
            entry["state"] = "unknown"
        out.append(entry)
    return out


def worker_facts(
    node_id: str,
    *,
    spawn_ids: Iterable[str],
    held_jobs: Iterable[tuple[str, str | None, str | None]],
    agents: Iterable[str],
    peers: Iterable[tuple[str, str, bool]],
) -> Facts:
    """What a worker (no database) classifies its live items with, from its memory (pure).

    `held_jobs` is (job id, agent offered or running it, spawned agent bound to it) per held job;
    `agents` the ids connected to this worker; `peers` (instance id, role, connected) per known peer.
    A known coordinator that is not connected makes nothing untracked (its jobs may bind an item).
    The forwarding coordinator adds its database's bindings on top (`overlay_coordinator_view`).
    """
    bindings: dict[str, str] = {}
    for job_id, agent_id, bound_agent_id in held_jobs:
        for value in (agent_id, bound_agent_id):
            if value:
                bindings.setdefault(value, job_id)
    known = list(peers)
    return Facts(
        node_id=node_id,
        spawn_ids=frozenset(spawn_ids),
        bindings=bindings,
        online=dict.fromkeys(agents, node_id),
        live_nodes=frozenset({node_id, *(peer for peer, _, connected in known if connected)}),
        stale_coordinators=tuple(
            sorted(peer for peer, role, connected in known if role == "coordinator" and not connected)
        ),
    )


@dataclass
class OrphanForwarder:
    """A coordinator's side of `--target`: ask the node, add what the shared database knows."""

    hub: PeerHub
    db: Database
    stale_window: timedelta

    async def listing(self, target: str, timeout_ms: int) -> dict[str, Any]:
        """The target's listing, classified with this coordinator's bindings and partition view."""
        reply = await self._ask(
            target, OrphansRequest(message_id=_id(), action="list", timeout_ms=timeout_ms)
        )
        bindings, online, disconnected = await self._coordinator_facts()
        remote_disconnected = list(getattr(reply, "disconnected_coordinators", None) or [])
        missing = sorted(set(remote_disconnected) | set(disconnected))
        return {
            "node": reply.node,
            "complete": not missing,
            "disconnected_coordinators": missing,
            "items": overlay_coordinator_view(
                reply.items or [], bindings=bindings, online=online, disconnected=bool(missing)
            ),
        }

    async def stop(self, target: str, vm_ids: list[str], timeout_ms: int) -> dict[str, Any]:
        """Stop on the target only what this coordinator also sees untracked now; report the rest."""
        listed = await self.listing(target, timeout_ms)
        by_id = {item["vm_id"]: item for item in listed["items"]}
        wanted = dedupe_ids(vm_ids)
        held: dict[str, dict[str, Any]] = {}
        for vm_id in wanted:
            item = by_id.get(vm_id)
            if item is not None and item["state"] == "tracked" and "job" in item["tracked_by"]:
                held[vm_id] = {
                    "vm_id": vm_id,
                    "outcome": "tracked",
                    "detail": f"bound to job {item['job_id']} (checked by the coordinator)",
                }
            elif item is not None and item["state"] == "unknown" and listed["disconnected_coordinators"]:
                held[vm_id] = {
                    "vm_id": vm_id,
                    "outcome": "unknown",
                    "detail": "coordinators disconnected: " + ", ".join(listed["disconnected_coordinators"]),
                }
        forwarded = [vm_id for vm_id in wanted if vm_id not in held]
        results: dict[str, dict[str, Any]] = dict(held)
        node = listed["node"]
        if forwarded:
            reply = await self._ask(
                target,
                OrphansRequest(message_id=_id(), action="stop", vm_ids=forwarded, timeout_ms=timeout_ms),
            )
            node = reply.node
            for result in reply.results or []:
                results[str(result.get("vm_id"))] = dict(result)
        return {"node": node, "results": [results[v] for v in wanted if v in results]}

    async def _coordinator_facts(self) -> tuple[dict[str, str], dict[str, str | None], list[str]]:
        async with self.db.read() as conn:
            bindings = await scaler_store.queue_bindings(conn)
            online = await scaler_store.online_agents(conn)
            coordinators = await scaler_store.coordinators(conn)
        _, stale = stale_coordinators(coordinators, utc_now(), self.stale_window)
        me = self.hub.identity.instance_id
        return bindings, online, [s for s in stale if s != me]

    async def _ask(self, target: str, request: OrphansRequest) -> OrphansResponse:
        if target not in self.hub.sessions:
            known = self.hub.registry.get(target) is not None or await self._has_row(target)
            require_connected(self.hub, target, known=known)
        reply = await ask_peer(self.hub, target, request, request.timeout_ms / 1000, OrphansResponse)
        if not reply.ok:
            raise ApiError(502, "peer_error", f"{target}: {reply.error or 'refused'}")
        return reply

    async def _has_row(self, target: str) -> bool:
        async with self.db.read() as conn:
            return await runtime_store.read_instance(conn, target) is not None


def install_orphan_answers(hub: PeerHub, orphans_of: Callable[[], Any | None]) -> None:
    """Answer coordinators' `peer.scaler.orphans.request` with this node's `Orphans` (if it has a scaler)."""

    async def answer(session: PeerSession, message: OrphansRequest) -> OrphansResponse:
        me = hub.identity.instance_id
        if session.peer_role != "coordinator":
            log.warning("refused an orphans request from %s (%s)", session.peer_id, session.peer_role)
            return OrphansResponse(message_id=message.message_id, ok=False, error=COORDINATORS_ONLY, node=me)
        orphans = orphans_of()
        if orphans is None:
            return OrphansResponse(
                message_id=message.message_id, ok=False, error="no scaler runs on this node", node=me
            )
        if message.action == "list":
            listing = await orphans.listing()
            return OrphansResponse(
                message_id=message.message_id,
                ok=True,
                node=listing["node"],
                items=listing["items"],
                complete=listing["complete"],
                disconnected_coordinators=listing["disconnected_coordinators"],
            )
        stopped = await orphans.stop(list(message.vm_ids or []))
        return OrphansResponse(
            message_id=message.message_id, ok=True, node=stopped["node"], results=stopped["results"]
        )

    hub.handle("peer.scaler.orphans.request", answer)


def _id() -> str:
    return uuid.uuid4().hex
