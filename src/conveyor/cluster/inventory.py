"""A node's inventory for its peer heartbeats (docs/design/cluster.md §2.3): connected agents and scaler
capacity.

Pure: built from what the agent hub and the scaler manager already hold.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from conveyor.cluster.messages import AgentInventory, ScalerInventory


class ConnectedAgent(Protocol):
    """What the inventory reads of an agent connection (`agents.hub.AgentConnection`)."""

    agent_id: str
    labels: tuple[str, ...]
    mandatory_labels: tuple[str, ...]
    capacity: int
    jobs: set[str]
    closed: bool


def agent_inventory(connections: Iterable[ConnectedAgent]) -> list[AgentInventory]:
    """Every open agent connection, sorted by agent id so beats compare equal when nothing changed."""
    return [
        AgentInventory(
            agent_id=agent.agent_id,
            labels=list(agent.labels),
            mandatory_labels=list(agent.mandatory_labels),
            active_jobs=len(agent.jobs),
            capacity=agent.capacity,
        )
        for agent in sorted(connections, key=lambda item: item.agent_id)
        if not agent.closed
    ]


def scaler_inventory(status: Iterable[Mapping[str, Any]]) -> list[ScalerInventory]:
    """Each scaler of `ScalerManager.status()` but a retiring one (it takes no new work)."""
    return [
        ScalerInventory(
            name=str(scaler["name"]),
            backend=str(scaler["type"]),
            label_sets=[list(labels) for labels in scaler.get("label_sets", [])],
            mandatory_labels=list(scaler.get("mandatory_labels", [])),
            max_agents=int(scaler.get("max_agents", 0)),
            active=int(scaler.get("active", 0)),
        )
        for scaler in status
        if scaler.get("state") != "retiring"
    ]
