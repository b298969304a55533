"""Orphans: live VMs, containers and agent processes nothing tracks any more (docs/design/scaler.md §7).

`classify` is pure. A live item is tracked by `spawn` (a spawn record for its agent id, in this
node's memory or `scaler_spawns`, or a node marker naming another live coordinator), by `job` (a
non-terminal queue row bound to or held by its agent id) or by `registered` (its agent is online).
While any coordinator's heartbeat is stale, nothing is called untracked: it reads `unknown`.
Stopping re-lists and re-classifies at the moment of the request and stops only untracked items.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from conveyor.model.ids import utc_now
from conveyor.scaler import store
from conveyor.scaler.backend import LiveItem, ScalerBackend

log = logging.getLogger(__name__)

State = Literal["tracked", "untracked", "unknown"]
MAX_STOP_IDS = 100


@dataclass(frozen=True)
class Facts:
    """What classification reads: spawn records, queue bindings, online agents, live coordinators."""

    node_id: str
    spawn_ids: frozenset[str]
    bindings: Mapping[str, str]  # agent id → non-terminal job id
    online: Mapping[str, str | None]  # agent id → coordinator it is connected to
    live_nodes: frozenset[str]
    stale_coordinators: tuple[str, ...]


@dataclass(frozen=True)
class Classified:
    """One live item with its trackers."""

    item: LiveItem
    tracked_by: tuple[str, ...]
    state: State
    job_id: str | None
    registered_with: str | None

    def as_json(self) -> dict[str, Any]:
        return {
            "vm_id": self.item.vm_id,
            "kind": self.item.kind,
            "backend": self.item.backend,
            "scaler": self.item.scaler,
            "agent_id": self.item.agent_id,
            "pid": self.item.pid,
            "started_at": self.item.started_at,
            "node_marker": self.item.node_marker,
            "tracked_by": list(self.tracked_by),
            "job_id": self.job_id,
            "registered_with": self.registered_with,
            "state": self.state,
        }


def classify(item: LiveItem, facts: Facts) -> Classified:
    """Name every tracker that holds for `item` and its state (pure)."""
    trackers: list[str] = []
    agent_id = item.agent_id
    other_node = item.node_marker is not None and item.node_marker != facts.node_id
    if (agent_id is not None and agent_id in facts.spawn_ids) or (
        other_node and item.node_marker in facts.live_nodes
    ):
        trackers.append("spawn")
    job_id = facts.bindings.get(agent_id) if agent_id is not None else None
    if job_id is not None:
        trackers.append("job")
    registered_with = None
    if agent_id is not None and agent_id in facts.online:
        trackers.append("registered")
        registered_with = facts.online[agent_id]
    if trackers:
        state: State = "tracked"
    elif facts.stale_coordinators:
        state = "unknown"
    else:
        state = "untracked"
    return Classified(item, tuple(trackers), state, job_id, registered_with)


def stale_coordinators(
    coordinators: Iterable[tuple[str, datetime]], now: datetime, window: timedelta
) -> tuple[list[str], list[str]]:
    """(live, stale) coordinator ids by heartbeat age (pure)."""
    live: list[str] = []
    stale: list[str] = []
    for instance_id, at in coordinators:
        (live if now - at <= window else stale).append(instance_id)
    return live, stale


def dedupe_ids(vm_ids: Iterable[str]) -> list[str]:
    """The ids in first-seen order, duplicates merged (pure)."""
    seen: dict[str, None] = {}
    for vm_id in vm_ids:
        seen.setdefault(vm_id, None)
    return list(seen)


FactsSource = Callable[[], Awaitable[Facts]]


def database_facts(manager: Any, db: Any, node_id: str, stale_window: timedelta) -> FactsSource:
    """A coordinator's facts: `scaler_spawns`, queue bindings, online agents and heartbeats in its database."""

    async def read() -> Facts:
        async with db.read() as conn:
            spawn_rows = await store.all_spawns(conn)
            bindings = await store.queue_bindings(conn)
            online = await store.online_agents(conn)
            coordinators = await store.coordinators(conn)
        live, stale = stale_coordinators(coordinators, utc_now(), stale_window)
        return Facts(
            node_id=node_id,
            spawn_ids=frozenset({row["agent_id"] for row in spawn_rows} | set(manager.spawns)),
            bindings=bindings,
            online=online,
            live_nodes=frozenset(live),
            stale_coordinators=tuple(s for s in stale if s != node_id),
        )

    return read


class Orphans:
    """Listing and stopping for the node that answers; `facts` reads what classification needs.

    A coordinator reads its database (`database_facts`); a worker, which has none, reads its memory
    (`conveyor.cluster.orphans.worker_facts`).
    """

    def __init__(self, manager: Any, node_id: str, facts: FactsSource) -> None:
        self.manager = manager
        self.node_id = node_id
        self._facts = facts

    async def _classified(self) -> tuple[Facts, list[tuple[ScalerBackend | None, Classified]]]:
        items = await self.manager.live_items()
        facts = await self._facts()
        return facts, [(backend, classify(item, facts)) for backend, item in items]

    async def listing(self) -> dict[str, Any]:
        facts, classified = await self._classified()
        return {
            "node": self.node_id,
            "complete": not facts.stale_coordinators,
            "disconnected_coordinators": list(facts.stale_coordinators),
            "items": [c.as_json() for _, c in classified],
        }

    async def stop(self, vm_ids: list[str]) -> dict[str, Any]:
        facts, classified = await self._classified()
        by_id = {c.item.vm_id: (backend, c) for backend, c in classified}
        results: list[dict[str, Any]] = []
        for vm_id in dedupe_ids(vm_ids):
            found = by_id.get(vm_id)
            if found is None:
                results.append(
                    {"vm_id": vm_id, "outcome": "not_found", "detail": "no live item with this id"}
                )
                continue
            backend, item = found
            if item.state == "tracked":
                detail = "tracked by " + ", ".join(item.tracked_by)
                if item.job_id:
                    detail += f" (job {item.job_id})"
                if item.registered_with:
                    detail += f" (registered with {item.registered_with})"
                results.append({"vm_id": vm_id, "outcome": "tracked", "detail": detail})
                continue
            if item.state == "unknown":
                results.append(
                    {
                        "vm_id": vm_id,
                        "outcome": "unknown",
                        "detail": "coordinators disconnected: " + ", ".join(facts.stale_coordinators),
                    }
                )
                continue
            if item.item.agent_id is not None and item.item.agent_id in self.manager.spawns:
                results.append({"vm_id": vm_id, "outcome": "tracked", "detail": "tracked by spawn"})
                continue
            try:
                await self.manager.stop_item(backend, item.item)
            except Exception as exc:
                log.exception("stopping orphan %s failed", vm_id)
                results.append({"vm_id": vm_id, "outcome": "failed", "detail": str(exc)[:500]})
                continue
            log.warning("stopped orphan %s %s (%s)", item.item.backend, item.item.kind, vm_id)
            metrics = getattr(self.manager, "metrics", None)
            if metrics is not None:
                metrics.orphans_stopped.labels(item.item.backend).inc()
            results.append({"vm_id": vm_id, "outcome": "stopped", "detail": f"{item.item.kind} stopped"})
        return {"node": self.node_id, "results": results}
