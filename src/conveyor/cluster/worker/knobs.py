"""What a worker's start-up wires in: its heartbeat inventory and the knobs it applies."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from conveyor.cluster.inventory import agent_inventory, scaler_inventory


def worker_inventory(hub: Any, manager: Any) -> tuple[list[Any], list[Any]]:
    """This worker's heartbeat inventory: its agents and its scalers' capacity."""
    agents = agent_inventory(hub.connections.values()) if hub is not None else []
    scalers = scaler_inventory(manager.status()) if manager is not None else []
    return agents, scalers


def worker_knob_default(settings: Any) -> Callable[[str, str | None], Awaitable[int]]:
    """A knob's value from the worker's own configuration (env/YAML default, else built in)."""
    from conveyor.model.knobs import CLUSTER_KNOBS_BY_NAME, ORG_KNOBS_BY_NAME

    async def knob(name: str, org_id: str | None) -> int:
        definition = ORG_KNOBS_BY_NAME.get(name) or CLUSTER_KNOBS_BY_NAME[name]
        value = settings.knob_default(definition)
        return int(value if value is not None else definition.default or 0)

    return knob


def worker_knob(settings: Any, snapshot: Any) -> Callable[[str, str | None], Awaitable[int]]:
    """The one accessor for the knobs a worker applies (e.g. `agent_token_ttl_ms`).

    A knob of the cluster-settings snapshot (docs/design/cluster.md §5.3: the "agents, scaler" group) is read
    from the applied snapshot at each call, so a pulled version applies at the next spawn; any other knob (and
    one a coordinator's snapshot left out) comes from the worker's own configuration.
    """
    fallback = worker_knob_default(settings)

    async def knob(name: str, org_id: str | None) -> int:
        applied = snapshot.current()
        if name in applied.settings:
            return int(applied.value(name))
        return await fallback(name, org_id)

    return knob
