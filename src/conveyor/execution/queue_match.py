"""Whether an agent can take a queued row (docs/design/execution.md §5, §13): pure, shared by the claim, the
sweeps' classification, the scaler and fan-out's choice of hosts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from conveyor.execution.enqueue import pin_label
from conveyor.matching import labels_satisfy, runs_on_from_json


@dataclass(frozen=True)
class AgentSlot:
    """An agent that can take one more job."""

    agent_id: str
    labels: tuple[str, ...]
    mandatory_labels: tuple[str, ...]
    # A connected worker's capacity (docs/design/cluster.md §4): it never claims a row that rerouting handed
    # back to local capacity (the job's `reroute_tried` is set once its hops or candidates ran out).
    remote: bool = False


def agent_can_take(runs_on: dict[str, Any], agent: AgentSlot) -> bool:
    """Full label match (pure): every matcher matches a label, no exclude does, mandatory labels named, and
    a row pinned to an agent (`runs_on.agent_id`) only for that agent."""
    pinned = runs_on.get("agent_id")
    if pinned is not None and pinned != agent.agent_id:
        return False  # a fan-out host execution runs on its own agent only (docs/design/execution.md §13)
    if not labels_satisfy(runs_on_from_json(runs_on), agent.labels):
        return False
    exact = {m["pattern"].lower() for m in runs_on.get("labels", []) if m.get("kind") == "exact"}
    return all(label in exact for label in agent.mandatory_labels)


def claim_labels(agent: AgentSlot) -> list[str]:
    """The labels PostgreSQL's claim pre-filters `exact_labels` with: the agent's, and its pin (a fan-out host
    execution's row holds its agent's pin among its exact labels, so no other agent's claim locks it)."""
    return sorted({*agent.labels, pin_label(agent.agent_id)})
