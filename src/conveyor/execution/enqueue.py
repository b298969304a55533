"""What every path that puts a job on the dispatch queue shares: the row's label pre-filter (its wake-up,
`DISPATCH_CHANNEL`, is in `conveyor.db.channels`).

Run creation, the needs scheduler and the concurrency releases all insert `dispatch_queue` rows; these
pieces sit below all of them so that `creation`, `cancel` and `lifecycle` import in one direction.
"""

from __future__ import annotations

from typing import Any


def exact_labels_of(runs_on: dict[str, Any]) -> list[str]:
    """The exact `runs_on` matchers (lowercased) of a `runs_on` document; SQL pre-filters on them."""
    return sorted({m["pattern"].lower() for m in runs_on.get("labels", []) if m.get("kind") == "exact"})


def pin_label(agent_id: str) -> str:
    """The exact label a fan-out host execution's queue row carries for its agent (docs/design/execution.md
    §13); no agent reports it (agents may not set `conveyor:` labels), so only the pinned agent's claim has it."""
    return f"conveyor:agent:{agent_id}".lower()
