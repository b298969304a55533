"""Rerouting's pure decisions (docs/design/cluster.md §4): which worker, what its answer means, what a
relayed spawn failure does, flap grace, a worker's capacity as claimable units.

They take plain values (a worker's last heartbeat inventory, an offer's fields) and return plain values.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

from conveyor.cluster.messages import AgentInventory, ScalerInventory
from conveyor.execution.queue import AgentSlot, agent_can_take
from conveyor.scaler.labels import asks_for_host

NAK_BACKOFF_BASE_MS = 1000
NAK_BACKOFF_CAP_MS = 60_000


# --- choosing a worker (docs/design/cluster.md §4.1)


@dataclass(frozen=True)
class WorkerView:
    """What a coordinator knows of one peer worker: from its session and its last heartbeat."""

    instance_id: str
    connected: bool
    draining: bool
    agents: Sequence[AgentInventory] = ()
    scalers: Sequence[ScalerInventory] = ()


@dataclass(frozen=True)
class WorkerCapacity:
    """A worker's free capacity for one job: matching free agent slots, matching free scaler room."""

    instance_id: str
    agent_slots: int
    scaler_room: int


def worker_capacity(runs_on: Mapping[str, Any], worker: WorkerView) -> WorkerCapacity:
    """How many of the worker's free agent slots and free scaler places could take a job with `runs_on`."""
    runs_on = dict(runs_on)
    slots = sum(
        agent.capacity - agent.active_jobs
        for agent in worker.agents
        if agent.capacity > agent.active_jobs
        and agent_can_take(
            runs_on, AgentSlot(agent.agent_id, tuple(agent.labels), tuple(agent.mandatory_labels))
        )
    )
    room = 0
    if not asks_for_host(runs_on):
        for scaler in worker.scalers:
            free = scaler.max_agents - scaler.active
            if free > 0 and any(
                agent_can_take(runs_on, AgentSlot("", tuple(labels), tuple(scaler.mandatory_labels)))
                for labels in scaler.label_sets
            ):
                room += free
    return WorkerCapacity(worker.instance_id, slots, room)


def worker_can_serve(runs_on: Mapping[str, Any], worker: WorkerView) -> bool:
    """Whether any agent or scaler label set of the worker matches the job, busy or not (pure)."""
    runs_on = dict(runs_on)
    if any(
        agent_can_take(runs_on, AgentSlot(agent.agent_id, tuple(agent.labels), tuple(agent.mandatory_labels)))
        for agent in worker.agents
    ):
        return True
    return not asks_for_host(runs_on) and any(
        scaler.max_agents > 0
        and any(
            agent_can_take(runs_on, AgentSlot("", tuple(labels), tuple(scaler.mandatory_labels)))
            for labels in scaler.label_sets
        )
        for scaler in worker.scalers
    )


def worker_wait_note(runs_on: Mapping[str, Any], workers: Iterable[WorkerView]) -> str | None:
    """The cluster's say on a job no local agent or scaler can take (pure, by instance id).

    `waiting: …` when a connected worker that is not draining matches it (it runs it once it has
    room); else `unschedulable: worker W matches but is draining` when only draining workers match (they
    take nothing until resumed, so the job still fails `unroutable` after the grace, naming W); else None.
    """
    draining: str | None = None
    for worker in sorted(workers, key=lambda view: view.instance_id):
        if not worker.connected or not worker_can_serve(runs_on, worker):
            continue
        if not worker.draining:
            return f"waiting: worker {worker.instance_id} can run it when it has room"
        draining = draining or worker.instance_id
    return f"unschedulable: worker {draining} matches but is draining" if draining else None


def choose_worker(
    runs_on: Mapping[str, Any],
    workers: Iterable[WorkerView],
    *,
    tried: Iterable[str] = (),
    backing_off: Iterable[str] = (),
    in_flight: Mapping[str, int] | None = None,
) -> str | None:
    """The worker to offer a job to, or None (the job stays queued) (docs/design/cluster.md §4.1, pure).

    Candidates are connected, not draining, not already tried, not in NAK backoff, and have a
    matching free agent slot or matching free scaler room. Order: free agent slots desc, then
    free scaler room desc, then instance id. `in_flight` counts offers per worker not yet in its
    inventory (sent and unanswered, or accepted since its last heartbeat): they speak for agent
    slots first, then scaler room.
    """
    excluded = set(tried) | set(backing_off)
    ranked: list[tuple[int, int, str]] = []
    for worker in workers:
        if not worker.connected or worker.draining or worker.instance_id in excluded:
            continue
        capacity = spoken_for(worker_capacity(runs_on, worker), (in_flight or {}).get(worker.instance_id, 0))
        if capacity.agent_slots or capacity.scaler_room:
            ranked.append(worker_rank(capacity))
    return min(ranked)[2] if ranked else None


def spoken_for(capacity: WorkerCapacity, offers: int) -> WorkerCapacity:
    """The capacity left once `offers` jobs not yet counted by the worker take agent slots, then room."""
    from_slots = min(capacity.agent_slots, max(0, offers))
    from_room = min(capacity.scaler_room, max(0, offers) - from_slots)
    return WorkerCapacity(
        capacity.instance_id, capacity.agent_slots - from_slots, capacity.scaler_room - from_room
    )


def worker_rank(capacity: WorkerCapacity) -> tuple[int, int, str]:
    """`choose_worker`'s order as a sort key: free agent slots desc, free scaler room desc, instance id."""
    return (-capacity.agent_slots, -capacity.scaler_room, capacity.instance_id)


def nak_backoff_ms(consecutive_naks: int) -> int:
    """How long a worker is skipped after `consecutive_naks` NAKs or ack timeouts: min(1 s·2ⁿ, 60 s)."""
    if consecutive_naks <= 0:
        return 0
    return min(NAK_BACKOFF_BASE_MS * 2 ** min(consecutive_naks, 16), NAK_BACKOFF_CAP_MS)


@dataclass
class NakBackoff:
    """Consecutive NAKs per worker (monotonic seconds injected by the caller)."""

    naks: dict[str, int] = field(default_factory=dict)
    since: dict[str, float] = field(default_factory=dict)

    def nak(self, worker: str, now: float) -> None:
        """A NAK or an ack timeout from `worker`."""
        self.naks[worker] = self.naks.get(worker, 0) + 1
        self.since[worker] = now

    def ack(self, worker: str) -> None:
        """An ACK resets the worker's backoff."""
        self.naks.pop(worker, None)
        self.since.pop(worker, None)

    def backing_off(self, now: float) -> set[str]:
        """Workers still inside their backoff at `now`."""
        return {
            worker
            for worker, count in self.naks.items()
            if now - self.since[worker] < nak_backoff_ms(count) / 1000
        }


# --- the worker's answer (docs/design/cluster.md §4.2)


@dataclass(frozen=True)
class RerouteAnswer:
    """A worker's answer to `job.reroute`: accepted (maybe a duplicate) or a NAK reason."""

    accepted: bool
    duplicate: bool = False
    reason: str | None = None


def reroute_answer(
    *,
    me: str,
    hop: int,
    max_hops: int,
    tried: Iterable[str],
    held: bool,
    draining: bool,
    has_capacity: bool,
    valid: bool = True,
) -> RerouteAnswer:
    """What a worker answers to an offer (pure).

    `invalid` first (nothing else can be trusted), then `duplicate` (an idempotent re-send of a job
    it holds is accepted even while draining: it already has it), then `loop`, `max-hops`,
    `draining`, `no-capacity`; otherwise accepted.
    """
    if not valid:
        return RerouteAnswer(False, reason="invalid")
    if held:
        return RerouteAnswer(True, duplicate=True)
    if me in set(tried):
        return RerouteAnswer(False, reason="loop")
    if hop > max_hops:
        return RerouteAnswer(False, reason="max-hops")
    if draining:
        return RerouteAnswer(False, reason="draining")
    if not has_capacity:
        return RerouteAnswer(False, reason="no-capacity")
    return RerouteAnswer(True)


# --- relayed spawn failures, Layer B (docs/design/cluster.md §4.3)


@dataclass(frozen=True)
class SpawnFailureVerdict:
    """What a relayed spawn failure does to a rerouted job.

    `action`: `ignore` (not from the holder: logged only), `persist` (recorded, the window keeps its
    deadline), `rearm` (recorded, one more attempt: `failures` and a new `window_expires_at`) or
    `redispatch` (recorded, the job is taken back now; `reason` is the metric's `final` or `cap`).
    """

    action: Literal["ignore", "persist", "rearm", "redispatch"]
    failures: int | None = None
    window_expires_at: datetime | None = None
    reason: str | None = None


def on_relayed_spawn_failure(
    *,
    sender: str,
    holder: str | None,
    status: str,
    window_expires_at: datetime | None,
    final: bool | None,
    failures: int,
    max_attempts: int,
    backoff_ms: int,
    spawn_window_ms: int,
    now: datetime,
) -> SpawnFailureVerdict:
    """Layer B (pure). Provenance: `sender` is the relaying session's authenticated instance id and
    must be the job's `rerouted_to` (`holder`), so a relay from any other peer, whatever its fields
    say, never acts. Only an armed window (accepted, not started) is acted on: `final: true`
    re-dispatches; `final: false` counts the failure and re-dispatches once it reaches
    `max_attempts`, else re-arms the window for one more attempt plus the backoff; a relay without
    `final` (an older worker retrying without a bound) is recorded only.
    """
    if holder is None or sender != holder:
        return SpawnFailureVerdict("ignore")
    if window_expires_at is None or status not in ("queued", "dispatched"):
        return SpawnFailureVerdict("persist")
    if final is True:
        return SpawnFailureVerdict("redispatch", reason="final")
    if final is None:
        return SpawnFailureVerdict("persist")
    counted = failures + 1
    if counted >= max_attempts:
        return SpawnFailureVerdict("redispatch", failures=counted, reason="cap")
    deadline = now + timedelta(milliseconds=backoff_ms + spawn_window_ms)
    return SpawnFailureVerdict("rearm", failures=counted, window_expires_at=deadline)


# --- flap grace (docs/design/cluster.md §4.5)


def within_flap_grace(*, connected: bool, last_heard_age_ms: int | None, flap_grace_ms: int) -> bool:
    """Whether the stale-run sweeps must leave a rerouted job alone: its worker is connected, or was
    heard from within the flap grace (an outbox replay is still on its way). A worker never heard
    from (forgotten, unknown) gets no grace."""
    if connected:
        return True
    return last_heard_age_ms is not None and last_heard_age_ms <= flap_grace_ms


# --- a worker's capacity as claimable units


def worker_agent_id(instance_id: str) -> str:
    """The `agent_id` a claim for a worker carries (`jobs.agent_id`, `dispatch_queue.agent_id`)."""
    return f"worker:{instance_id}"[:64]


@dataclass(frozen=True)
class CapacityUnit:
    """One label set a worker has free room for (an agent's labels or a scaler's label set)."""

    key: str
    labels: tuple[str, ...]
    mandatory_labels: tuple[str, ...]
    free: int


def capacity_units(worker: WorkerView) -> list[CapacityUnit]:
    """A worker's free capacity as claimable units, from its last heartbeat (pure)."""
    units = [
        CapacityUnit(
            f"{worker.instance_id}/agent/{agent.agent_id}",
            tuple(agent.labels),
            tuple(agent.mandatory_labels),
            agent.capacity - agent.active_jobs,
        )
        for agent in worker.agents
        if agent.capacity > agent.active_jobs
    ]
    for scaler in worker.scalers:
        room = scaler.max_agents - scaler.active
        if room <= 0:
            continue
        units.extend(
            CapacityUnit(
                f"{worker.instance_id}/scaler/{scaler.name}/{index}",
                tuple(labels),
                tuple(scaler.mandatory_labels),
                room,
            )
            for index, labels in enumerate(scaler.label_sets)
        )
    return units
