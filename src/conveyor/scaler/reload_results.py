"""Per-node answers of `scaler reload --target NODE|all` (docs/design/scaler.md §3.1): one shape for this
node's own reload and for those asked over the peer channel, and how they add up.

Pure, except `reload_here`, which runs the local manager's reload and turns its refusal into an answer.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal, Protocol

from conveyor.scaler.config import ScalerConfigError
from conveyor.scaler.manager import ReloadInProgress

ReloadOutcome = Literal["reloaded", "refused", "unreachable"]
OUTCOMES: tuple[ReloadOutcome, ...] = ("reloaded", "refused", "unreachable")
ALL_NODES = "all"
KEPT = "the running configuration was kept"


class Reloadable(Protocol):
    """What `reload_here` needs of the scaler manager."""

    async def reload(self) -> dict[str, Any]:
        """Re-read and apply the configuration (raises `ScalerConfigError`, `ReloadInProgress`)."""


def node_result(
    node: str, role: str, outcome: ReloadOutcome, detail: str = "", scalers: Iterable[str] | None = None
) -> dict[str, Any]:
    """One node's answer as the route returns it."""
    result: dict[str, Any] = {"node": node, "role": role, "outcome": outcome, "detail": detail}
    if scalers is not None:
        result["scalers"] = list(scalers)
    return result


def refusal_detail(problems: Iterable[str]) -> str:
    """The config error as `POST scaler/reload` words it: every problem, then that nothing changed."""
    return "; ".join([*problems, KEPT])


async def reload_here(manager: Reloadable, node: str, role: str) -> dict[str, Any]:
    """Reload this node's scaler configuration; a refused one is an answer, not an exception."""
    try:
        applied = await manager.reload()
    except ScalerConfigError as exc:
        return node_result(node, role, "refused", refusal_detail(exc.problems))
    except ReloadInProgress as exc:
        return node_result(node, role, "refused", f"{exc}; try again when it has finished")
    scalers = list(applied.get("scalers", []))
    return node_result(node, role, "reloaded", "applied: " + (", ".join(scalers) or "no scalers"), scalers)


def summarise(target: str, me: str, results: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The route's answer: this node's result first, then the others by instance id, and a count per
    outcome (every outcome present, zero or not)."""
    ordered = sorted(results, key=lambda r: (r["node"] != me, r["node"]))
    counts: dict[str, int] = {
        outcome: sum(1 for r in ordered if r["outcome"] == outcome) for outcome in OUTCOMES
    }
    return {"target": target, "results": ordered, **counts}
