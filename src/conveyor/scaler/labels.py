"""Which configured label set serves a job (pure; docs/design/scaler.md §5).

The label rule itself is the dispatcher's (`conveyor.execution.queue.agent_can_take`, which calls
`conveyor.matching.labels_satisfy`): each `runs_on` matcher matches a label of the set, every
mandatory label of the scaler equals an exact matcher, no `exclude` matcher matches a label of the
set. Among matches the smallest label set wins; ties go to configuration order.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from conveyor.execution.queue import AgentSlot, agent_can_take

HOST_LABEL_PREFIX = "conveyor:host:"

# Automatic labels by backend type: bare-metal reports the host, containers and VMs run Linux.
GUEST_OS = {"container": "linux", "firecracker": "linux"}


def normalise(labels: Iterable[str]) -> tuple[str, ...]:
    """Strip, lowercase, dedupe, sort (empty labels dropped)."""
    return tuple(sorted({label.strip().lower() for label in labels if label.strip()}))


def auto_labels(backend_type: str, host_os: str, host_arch: str) -> tuple[str, ...]:
    """`conveyor:os:*` and `conveyor:arch:*` of a label set of `backend_type` on this host."""
    os_value = GUEST_OS.get(backend_type, host_os)
    return (f"conveyor:arch:{host_arch}", f"conveyor:os:{os_value}")


@dataclass(frozen=True)
class Candidate:
    """One label set of one scaler, in configuration order."""

    scaler: str
    index: int  # the label set's position within its scaler
    labels: tuple[str, ...]  # user labels plus automatic labels, normalised
    mandatory_labels: tuple[str, ...]
    retiring: bool = False


def asks_for_host(runs_on: dict[str, Any]) -> bool:
    """A job naming `conveyor:host:<name>` wants one particular machine: never a spawn."""
    return any(
        str(m.get("pattern", "")).lower().startswith(HOST_LABEL_PREFIX) for m in runs_on.get("labels", [])
    )


def label_set_matches(runs_on: dict[str, Any], candidate: Candidate) -> bool:
    """The label rule of docs/design/execution.md §5 applied to one label set."""
    if candidate.retiring or asks_for_host(runs_on):
        return False
    slot = AgentSlot(agent_id="", labels=candidate.labels, mandatory_labels=candidate.mandatory_labels)
    return agent_can_take(runs_on, slot)


def pick_label_set(runs_on: dict[str, Any], candidates: Sequence[Candidate]) -> Candidate | None:
    """The matching label set with the fewest labels; the first in configuration order on ties."""
    best: Candidate | None = None
    for candidate in candidates:
        if label_set_matches(runs_on, candidate) and (
            best is None or len(candidate.labels) < len(best.labels)
        ):
            best = candidate
    return best


def matching_label_sets(runs_on: dict[str, Any], candidates: Sequence[Candidate]) -> list[Candidate]:
    """Every label set that could serve the job, in configuration order."""
    return [c for c in candidates if label_set_matches(runs_on, c)]
