"""The seeded fault schedule: which fault hits which process when, and for how long (pure, no I/O).

A schedule is a list of episodes. Each episode starts a fault and, after its duration, ends it: a
killed process is restarted, a frozen one thawed, a cut link restored, a filled disk emptied. Two
episodes never overlap on one target, and at most one coordinator is down or frozen at a time (the load
balancer in front of the two always finds one; the chaos is in everything behind it).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any


class FaultKind(StrEnum):
    """What an episode does to its target."""

    KILL = "kill-9"  # SIGKILL, then a restart on the same home and port
    FREEZE = "sigstop"  # SIGSTOP, then SIGCONT: a partition as the node's peers see it
    LINK_CUT = "link-cut"  # the proxy between a worker and a coordinator drops every connection
    PG_TERMINATE = "pg-terminate"  # pg_terminate_backend on the coordinators' database sessions
    DISK_FULL = "disk-full"  # a node's home (a small tmpfs) filled to the last byte
    SPAWNED_KILL = "kill-9-spawned"  # SIGKILL of a scaler-spawned agent (the scaler owns the restart)


@dataclass(frozen=True)
class Targets:
    """The names the planner may pick from (what the cluster actually runs)."""

    coordinators: Sequence[str]
    workers: Sequence[str]
    agents: Sequence[str]
    links: Sequence[tuple[str, str]]  # (worker, coordinator) pairs with a cuttable proxy
    disks: Sequence[str] = ()  # nodes whose home is a tmpfs (empty: the kind is skipped)


@dataclass(frozen=True)
class Fault:
    """One episode: `kind` on `target` from `at` seconds after the start, for `duration` seconds."""

    at: float
    kind: FaultKind
    target: str
    duration: float
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def ends_at(self) -> float:
        """When the episode's fault is undone."""
        return self.at + self.duration

    def describe(self) -> str:
        """One line for a report: `t=12.3s kill-9 w1 (2.0s)`."""
        return f"t={self.at:.1f}s {self.kind.value} {self.target} ({self.duration:.1f}s)"

    def as_record(self) -> dict[str, Any]:
        """A JSON-able form of the episode."""
        record = asdict(self)
        record["kind"] = self.kind.value
        return record


# Relative weight of each kind, and its duration range in seconds.
WEIGHTS: dict[FaultKind, float] = {
    FaultKind.KILL: 3,
    FaultKind.FREEZE: 2,
    FaultKind.LINK_CUT: 2,
    FaultKind.PG_TERMINATE: 2,
    FaultKind.DISK_FULL: 1,
    FaultKind.SPAWNED_KILL: 1,
}
DURATIONS: dict[FaultKind, tuple[float, float]] = {
    FaultKind.KILL: (0.5, 4.0),
    FaultKind.FREEZE: (1.0, 6.0),
    FaultKind.LINK_CUT: (1.0, 8.0),
    FaultKind.PG_TERMINATE: (0.0, 0.0),
    FaultKind.DISK_FULL: (2.0, 10.0),
    FaultKind.SPAWNED_KILL: (0.0, 0.0),
}


def plan_faults(
    seed: int,
    duration_s: float,
    targets: Targets,
    *,
    mean_gap_s: float = 6.0,
    warmup_s: float = 5.0,
    kinds: Sequence[FaultKind] | None = None,
) -> list[Fault]:
    """The schedule of a run: episodes from `warmup_s` until the last one ends before `duration_s`.

    Gaps between starts are exponential with mean `mean_gap_s`; kinds are drawn by `WEIGHTS` among
    `kinds` (default: every kind the targets allow). Deterministic in `seed`.
    """
    rng = random.Random(seed)
    allowed = [k for k in (kinds or list(FaultKind)) if _possible(k, targets)]
    if not allowed:
        return []
    busy_until: dict[str, float] = {}
    coordinator_busy_until = 0.0
    faults: list[Fault] = []
    at = warmup_s
    while True:
        at += rng.expovariate(1.0 / mean_gap_s)
        kind = rng.choices(allowed, weights=[WEIGHTS[k] for k in allowed])[0]
        low, high = DURATIONS[kind]
        length = round(rng.uniform(low, high), 2)
        if at + length >= duration_s:
            break
        target = _pick_target(rng, kind, targets)
        detail: dict[str, Any] = {}
        if kind is FaultKind.PG_TERMINATE:
            detail["share"] = rng.choice([0.5, 1.0])  # some or all of the coordinators' sessions
        if busy_until.get(target, -1.0) > at:
            continue  # that target is still in an earlier episode: skip this draw
        if target in targets.coordinators and kind in (FaultKind.KILL, FaultKind.FREEZE):
            if coordinator_busy_until > at:
                continue
            coordinator_busy_until = at + length + 1.0
        busy_until[target] = at + length + 0.5
        faults.append(Fault(round(at, 2), kind, target, length, detail))
    return faults


def _possible(kind: FaultKind, targets: Targets) -> bool:
    if kind is FaultKind.LINK_CUT:
        return bool(targets.links)
    if kind is FaultKind.DISK_FULL:
        return bool(targets.disks)
    if kind is FaultKind.SPAWNED_KILL:
        return bool(targets.workers or targets.coordinators)
    return True


def _pick_target(rng: random.Random, kind: FaultKind, targets: Targets) -> str:
    if kind in (FaultKind.KILL, FaultKind.FREEZE):
        return rng.choice([*targets.coordinators, *targets.workers, *targets.agents])
    if kind is FaultKind.LINK_CUT:
        worker, coordinator = rng.choice(list(targets.links))
        return f"{worker}->{coordinator}"
    if kind is FaultKind.DISK_FULL:
        return rng.choice(list(targets.disks))
    if kind is FaultKind.SPAWNED_KILL:
        return "spawned"  # any live scaler-spawned agent, chosen when the episode starts
    return "database"


def count_by_kind(faults: Sequence[Fault]) -> dict[str, int]:
    """How many episodes of each kind (every kind listed, zeros included)."""
    counts = {kind.value: 0 for kind in FaultKind}
    for fault in faults:
        counts[fault.kind.value] += 1
    return counts
