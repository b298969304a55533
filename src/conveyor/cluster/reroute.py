"""Job rerouting, coordinator side (docs/design/cluster.md §4): which worker, what its answer means, flap
grace.

The decisions are pure functions over plain values (a worker's last heartbeat inventory, the offer's
fields); `RerouteService` around them loads, decides and stores.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, Protocol

from prometheus_client import CollectorRegistry, Counter
from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.cluster import store
from conveyor.cluster.messages import (
    AgentInventory,
    EventEmitRelay,
    EventEmitResultRelay,
    JobCancelRelay,
    JobCancelRequest,
    JobProgress,
    JobProgressAck,
    JobReroute,
    JobRerouteAck,
    LogChunkRelay,
    PeerError,
    RerouteCheckout,
    RerouteLabels,
    ScalerEventRelay,
    ScalerInventory,
    SpawnRetry,
)
from conveyor.db.engine import Database
from conveyor.db.tables import DEFAULT_ORG
from conveyor.execution.dispatcher import Dispatcher
from conveyor.execution.lifecycle import (
    Effects,
    finish_job,
    lock_job_for_change,
    record_step,
    start_job,
    timeline,
)
from conveyor.execution.logs import masker_for
from conveyor.execution.queue import AgentSlot, Claim, agent_can_take, requeue
from conveyor.model import protocol as p
from conveyor.model.ids import new_id, utc_now
from conveyor.model.masking import Masker
from conveyor.model.protocol import JobDispatch
from conveyor.model.states import JOB_TERMINAL
from conveyor.runtime import store as instance_store
from conveyor.runtime.loops import WakeableLoop
from conveyor.scaler.labels import asks_for_host

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RerouteMetrics:
    """`conveyor_reroute_total{outcome}` and `conveyor_reroute_redispatch_total{reason}`, in a registry."""

    offers: Counter
    redispatches: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry | None = None) -> RerouteMetrics:
        """The collectors in `registry` (a private one when None)."""
        registry = registry if registry is not None else CollectorRegistry()
        return cls(
            Counter(
                "conveyor_reroute_total", "Answers to job.reroute offers", ["outcome"], registry=registry
            ),
            Counter(
                "conveyor_reroute_redispatch_total",
                "Rerouted jobs taken back from their worker",
                ["reason"],
                registry=registry,
            ),
        )


NAK_BACKOFF_BASE_MS = 1000
# `dispatch_history.reason` is a String(32).
HISTORY_REASON_MAX = 32
# A spawn-window check that could not read or write the row looks again after this long.
WINDOW_RETRY_S = 1.0
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


# --- the coordinator's service: claim for a worker, offer, ack, progress (docs/design/cluster.md §4.2, §4.5)


TEST_WITHHOLD_ACKS_ENV = "CONVEYOR_TEST_WITHHOLD_PROGRESS_ACKS"


@dataclass(frozen=True)
class RerouteSettings:
    """Per-job reroute knobs, resolved when the offer is made (org > cluster > env default)."""

    ack_timeout_ms: int = 15_000
    max_hops: int = 3
    spawn_window_ms: int = 90_000
    spawn_max_attempts: int = 3
    spawn_retry_backoff_ms: int = 5_000


async def resolve_reroute_settings(
    org_id: str, org_value: Callable[[str, str], Awaitable[int | None]]
) -> RerouteSettings:
    """An org's per-job reroute knobs (docs/design/cluster.md §4.2): its `org_settings` column, else the
    `cluster_settings` column, else the env/YAML default (`org_value` is `SettingsResolver.org_value`); a knob
    with no value at all keeps the built-in default."""
    built_in = RerouteSettings()

    async def knob(name: str, fallback: int) -> int:
        value = await org_value(org_id, name)
        return int(value) if value is not None else fallback

    return RerouteSettings(
        ack_timeout_ms=await knob("reroute_ack_timeout_ms", built_in.ack_timeout_ms),
        max_hops=await knob("reroute_max_hops", built_in.max_hops),
        spawn_window_ms=await knob("reroute_spawn_window_ms", built_in.spawn_window_ms),
        spawn_max_attempts=await knob("reroute_spawn_max_attempts", built_in.spawn_max_attempts),
        spawn_retry_backoff_ms=await knob("reroute_spawn_retry_backoff_ms", built_in.spawn_retry_backoff_ms),
    )


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


class PeerSender(Protocol):
    """How the service reaches a peer: the hub's live session for it, if any."""

    def session_for(self, instance_id: str) -> Any:
        """The live `PeerSession` of `instance_id`, or None."""
        ...

    def connected(self, role: str | None = None) -> list[str]:
        """Instance ids of peers with a live session here (optionally of one role)."""
        ...


@dataclass(eq=False)
class WorkerLink:
    """One unit of a worker's free capacity, as the dispatcher sees an agent (`AgentLink`).

    The dispatcher claims a pending row whose labels match the unit and calls `offer`, which sends
    `job.reroute`; coordinators' own agents are served first (their idle times sort before ours).
    """

    service: RerouteService
    worker: str
    unit: CapacityUnit
    rank: int
    in_flight: int = 0
    agent_id: str = ""  # the claim's agent id: the worker's pseudo agent

    def __post_init__(self) -> None:
        self.agent_id = worker_agent_id(self.worker)

    def free_slot(self) -> AgentSlot | None:
        """The unit's labels while it has room not yet spoken for and the worker takes offers."""
        if self.unit.free - self.in_flight <= 0 or not self.service.offerable(self.worker):
            return None
        return AgentSlot(self.agent_id, self.unit.labels, self.unit.mandatory_labels, remote=True)

    def idle_since(self) -> float:
        """After every local agent (they are served first), in `choose_worker` order."""
        return float("inf") if self.rank < 0 else 1e15 + self.rank

    def bound_job_id(self) -> str | None:
        """Never bound."""
        return None

    async def offer(self, dispatch: JobDispatch) -> bool:
        """Send `job.reroute`; False when the worker's session is gone (the claim is given back)."""
        return await self.service.offer(self, dispatch)


@dataclass
class PendingOffer:
    """A `job.reroute` waiting for its ack."""

    link: WorkerLink
    dispatch: JobDispatch
    hop: int
    tried: list[str]
    settings: RerouteSettings
    org_id: str
    timer: asyncio.Task[None] | None = None

    @property
    def job_id(self) -> str:
        return self.dispatch.job_id

    @property
    def run_id(self) -> str:
        return self.dispatch.run_id

    @property
    def attempt(self) -> int:
        return self.dispatch.attempt


class RerouteService:
    """Coordinator side of rerouting: worker capacity in the dispatcher, offers, acks, progress."""

    def __init__(
        self,
        db: Database,
        dispatcher: Dispatcher,
        peers: PeerSender,
        *,
        owner: Callable[[], str],
        settings: Callable[[str], Awaitable[RerouteSettings]],
        max_attempts: int,
        append_log: Callable[[AsyncConnection, p.LogChunk, list[str]], Awaitable[Any]] | None = None,
        event_emitter: Callable[[], Callable[[str, p.EventEmit], Awaitable[p.EventEmitResult]] | None] = (
            lambda: None
        ),
        on_effects: Callable[[Effects], Awaitable[None]] | None = None,
        on_job_changed: Callable[[str], None] = lambda _job_id: None,
        secret_values: Callable[[AsyncConnection, str], Awaitable[list[str]]] | None = None,
        clock: Callable[[], float] = time.monotonic,
        metrics: RerouteMetrics | None = None,
        cancel_poll_s: float = 1.0,
    ) -> None:
        self.db = db
        self.metrics = metrics or RerouteMetrics.create()
        self.dispatcher = dispatcher
        self.peers = peers
        self.owner = owner
        self.settings = settings
        self.max_attempts = max_attempts
        self.append_log = append_log
        self.event_emitter = event_emitter
        self.on_effects = on_effects
        self.on_job_changed = on_job_changed
        self.clock = clock
        self.backoff = NakBackoff()
        self.links: dict[str, WorkerLink] = {}
        self.pending: dict[str, PendingOffer] = {}
        # Secret values sent with each job still held by a worker: relayed log lines, outputs and emitted
        # payloads are masked with them again here (defence in depth; the worker masks first). A job
        # offered before this process started has its values read again (`secret_values`).
        self.job_secrets: dict[str, list[str]] = {}
        self.secret_values = secret_values
        self.workers: dict[str, WorkerView] = {}
        self._withhold_acks = int(os.environ.get(TEST_WITHHOLD_ACKS_ENV) or 0)
        self._cancels_sent: set[tuple[str, bool]] = set()
        # Spawn-window timers by job id (Layer A), mirroring `jobs.reroute_window_expires_at`.
        self.windows: dict[str, asyncio.Task[None]] = {}
        self._cancel_loop = WakeableLoop("reroute-cancels", self.send_cancels, cancel_poll_s, log)

    async def start(self) -> None:
        """Re-arm the spawn windows of jobs this coordinator holds, and begin relaying cancels."""
        await self.rearm_windows()
        await self._cancel_loop.start()

    async def stop(self) -> None:
        """Stop relaying cancels; pending ack and spawn-window timers end."""
        await self._cancel_loop.stop()
        timers = [offer.timer for offer in self.pending.values() if offer.timer is not None]
        timers += self.windows.values()
        self.windows = {}
        for timer in timers:
            if timer is not asyncio.current_task():
                timer.cancel()
        # Let each timer unwind (a database call it was in ends) before the loop may close.
        await asyncio.gather(*(t for t in timers if t is not asyncio.current_task()), return_exceptions=True)

    async def send_cancels(self) -> int:
        """`job.cancel` (once per job and force) for each job being cancelled that a connected worker holds."""
        connected = sorted(w for w, view in self.workers.items() if view.connected)
        if not connected:
            return 0
        async with self.db.read() as conn:
            rows = await store.cancelling_rerouted(conn, connected)
        sent = 0
        for job_id, run_id, worker, reason in rows:
            force = "(force)" in (reason or "")
            if (job_id, force) in self._cancels_sent:
                continue
            self._cancels_sent.add((job_id, force))
            shown = (reason or "cancelled").replace(" (force)", "")
            await self._send(
                worker, JobCancelRequest(run_id=run_id, job_id=job_id, reason=shown, force=force)
            )
            sent += 1
        return sent

    # --- capacity

    def offerable(self, worker: str) -> bool:
        """Connected, not draining, not in NAK backoff."""
        view = self.workers.get(worker)
        return (
            view is not None
            and view.connected
            and not view.draining
            and worker not in self.backoff.backing_off(self.clock())
        )

    def worker_seen(self, view: WorkerView) -> None:
        """A worker's heartbeat (or its session ending): rebuild its capacity units and wake the dispatcher."""
        self.workers[view.instance_id] = view
        for key in [k for k, link in self.links.items() if link.worker == view.instance_id]:
            del self.links[key]
            self.dispatcher.agents.pop(key, None)
        if view.connected:
            ranked = sorted(self.workers.values(), key=lambda w: worker_rank(_any_capacity(w)))
            order = {w.instance_id: i for i, w in enumerate(ranked)}
            for unit in capacity_units(view):
                in_flight = sum(1 for o in self.pending.values() if o.link.unit.key == unit.key)
                link = WorkerLink(self, view.instance_id, unit, order[view.instance_id], in_flight)
                self.links[unit.key] = link
                self.dispatcher.agents[unit.key] = link
        self.dispatcher.wake()

    def worker_gone(self, instance_id: str) -> None:
        """The worker's session ended: its capacity leaves routing at once."""
        view = self.workers.get(instance_id)
        if view is not None:
            self.worker_seen(WorkerView(instance_id, False, view.draining, view.agents, view.scalers))

    def wait_note(self, runs_on: Mapping[str, Any]) -> str | None:
        """The connected workers' say on a job nothing local can take (`worker_wait_note`)."""
        return worker_wait_note(runs_on, self.workers.values())

    # --- offers

    async def offer(self, link: WorkerLink, dispatch: JobDispatch) -> bool:
        """Send `job.reroute` (hop 1) for a job the dispatcher claimed for `link`.

        The job goes to `choose_worker`'s pick (docs/design/cluster.md §4.1), which may be another worker than
        the one whose capacity claimed the row; its ack (or the ack timeout) decides what follows.
        """
        if self.peers.session_for(link.worker) is None:
            return False
        me = self.owner()
        # The job's row says which org's knobs apply (a dispatch's context names no org).
        async with self.db.read() as conn:
            org_id = await store.job_org(conn, dispatch.job_id) or DEFAULT_ORG
        settings = await self.settings(org_id)
        chosen = self._link_for(self.choose(_runs_on(dispatch), [me]), _runs_on(dispatch))
        if chosen is not None and chosen.worker != link.worker:
            async with self.db.transaction() as conn:
                await lock_job_for_change(conn, dispatch.job_id)
                now = await store.database_now(conn)
                moved = await store.move_claim(
                    conn,
                    job_id=dispatch.job_id,
                    attempt=dispatch.attempt,
                    from_agent=link.agent_id,
                    to_agent=chosen.agent_id,
                    owner=me,
                    now=now,
                    ack_deadline=now + timedelta(milliseconds=settings.ack_timeout_ms),
                    # No offer ended: the claim only changes hands before the first one.
                    outcome=None,
                    detail=None,
                )
            if moved:
                sent = await self._send_offer(
                    chosen, dispatch, hop=1, tried=[me], settings=settings, org_id=org_id
                )
                if not sent:
                    # The dispatcher gives back only its own link's claim: this one is ours to give back.
                    await self._give_back_unsent(dispatch, chosen)
                return True
        async with self.db.transaction() as conn:
            now = await store.database_now(conn)
            await store.extend_offer_deadline(
                conn,
                job_id=dispatch.job_id,
                claimed_by=link.agent_id,
                attempt=dispatch.attempt,
                ack_deadline=now + timedelta(milliseconds=settings.ack_timeout_ms),
            )
        return await self._send_offer(link, dispatch, hop=1, tried=[me], settings=settings, org_id=org_id)

    async def _give_back_unsent(self, dispatch: JobDispatch, link: WorkerLink) -> None:
        """An offer that never left (the session ended): the row goes back to `pending` as it was."""
        async with self.db.transaction() as conn:
            effects = await requeue(
                conn,
                dispatch.job_id,
                outcome="agent_lost",
                detail=f"worker {link.worker}: send failed",
                now=utc_now(),
                max_attempts=self.max_attempts,
                agent_id=link.agent_id,
                attempt=dispatch.attempt,
            )
        if effects and self.on_effects is not None:
            await self.on_effects(effects)
        self.dispatcher.wake()

    def choose(self, runs_on: Mapping[str, Any], tried: Sequence[str]) -> str | None:
        """`choose_worker` over what this coordinator knows now (heartbeats, backoff, offers in flight)."""
        in_flight: dict[str, int] = {}
        for link in self.links.values():
            in_flight[link.worker] = in_flight.get(link.worker, 0) + link.in_flight
        return choose_worker(
            runs_on,
            self.workers.values(),
            tried=tried,
            backing_off=self.backoff.backing_off(self.clock()),
            in_flight=in_flight,
        )

    def _link_for(self, worker: str | None, runs_on: Mapping[str, Any]) -> WorkerLink | None:
        """The worker's capacity unit that takes the job: a free matching agent first, then a scaler's."""
        if worker is None:
            return None
        fitting = [
            link
            for link in self.links.values()
            if link.worker == worker
            and (slot := link.free_slot()) is not None
            and agent_can_take(dict(runs_on), slot)
        ]
        fitting.sort(key=lambda link: ("/agent/" not in link.unit.key, link.unit.key))
        return fitting[0] if fitting else None

    async def _send_offer(
        self,
        link: WorkerLink,
        dispatch: JobDispatch,
        *,
        hop: int,
        tried: list[str],
        settings: RerouteSettings,
        org_id: str,
    ) -> bool:
        """Send one offer and arm its ack timer; False when the worker's session is gone."""
        session = self.peers.session_for(link.worker)
        if session is None:
            return False
        me = self.owner()
        message = JobReroute(
            message_id=dispatch.id,
            job_id=dispatch.job_id,
            run_id=dispatch.run_id,
            org_id=org_id,
            # The offering coordinator (the claim's owner): progress goes to it first.
            coordinator_id=me,
            hop=hop,
            max_hops=settings.max_hops,
            tried=tried,
            labels=RerouteLabels(runs_on=_runs_on(dispatch)),
            job=dispatch.job,
            workflow=dispatch.workflow.model_dump(mode="json"),
            attempt=dispatch.attempt,
            env=dispatch.env,
            upstream=dispatch.upstream,
            context=dispatch.context,
            log_max_bytes=dispatch.log_max_bytes,
            checkout=RerouteCheckout(
                repo_url=dispatch.repo.clone_url,
                ref=dispatch.repo.ref,
                sha=dispatch.repo.sha,
                auth_header=dispatch.repo.auth_header,
            ),
            secrets=dispatch.secrets,
            spawn_retry=SpawnRetry(
                max_attempts=settings.spawn_max_attempts, backoff_ms=settings.spawn_retry_backoff_ms
            ),
            # The claim's credential: every hop of this claim carries the same one, which the coordinators
            # check on the routes the worker proxies (docs/design/artifacts.md §4).
            job_token=dispatch.artifacts.token if dispatch.artifacts else None,
        )
        offer = PendingOffer(link, dispatch, hop, list(tried), settings, org_id)
        self.pending[dispatch.id] = offer
        link.in_flight += 1
        self.job_secrets[dispatch.job_id] = [
            *dispatch.secrets.values(),
            *([dispatch.repo.auth_header] if dispatch.repo.auth_header else []),
        ]
        try:
            await session.send(message)
        except Exception:
            self._forget_offer(dispatch.id)
            self.job_secrets.pop(dispatch.job_id, None)
            return False
        offer.timer = asyncio.create_task(
            self._ack_timer(dispatch.id, settings.ack_timeout_ms), name=f"reroute-ack-{dispatch.job_id}"
        )
        log.info(
            "offered job %s to worker %s (hop %d of %d)",
            dispatch.job_id,
            link.worker,
            hop,
            settings.max_hops,
            extra={"job_id": dispatch.job_id, "run_id": dispatch.run_id},
        )
        return True

    def _forget_offer(self, message_id: str) -> PendingOffer | None:
        offer = self.pending.pop(message_id, None)
        if offer is not None:
            offer.link.in_flight = max(0, offer.link.in_flight - 1)
            if offer.timer is not None and offer.timer is not asyncio.current_task():
                offer.timer.cancel()
        return offer

    async def _ack_timer(self, message_id: str, timeout_ms: int) -> None:
        await asyncio.sleep(timeout_ms / 1000)
        offer = self.pending.get(message_id)
        if offer is None:
            return
        self._forget_offer(message_id)
        self.metrics.offers.labels("ack-timeout").inc()
        self.metrics.redispatches.labels("ack-timeout").inc()
        log.warning("worker %s did not answer the offer of job %s in time", offer.link.worker, offer.job_id)
        # It may have accepted late: tell it to drop the job.
        await self._send(
            offer.link.worker,
            JobCancelRequest(run_id=offer.run_id, job_id=offer.job_id, reason="ack-timeout", force=True),
        )
        await self._refused(offer, "ack_timeout", "ack-timeout", f"worker {offer.link.worker}: ack-timeout")

    async def _refused(self, offer: PendingOffer, outcome: str, reason: str, detail: str) -> None:
        """A NAK or an ack timeout (docs/design/cluster.md §4.2): the worker backs off and the same job goes
        to the next candidate with `hop + 1`, or back to local capacity when hops or candidates ran out."""
        self.backoff.nak(offer.link.worker, self.clock())
        await self._route_onwards(
            offer.dispatch,
            from_agent=offer.link.agent_id,
            tried=[*offer.tried, offer.link.worker],
            hop=offer.hop + 1,
            settings=offer.settings,
            org_id=offer.org_id,
            outcome=outcome,
            reason=reason,
            detail=detail,
        )

    async def _route_onwards(
        self,
        dispatch: JobDispatch,
        *,
        from_agent: str,
        tried: list[str],
        hop: int,
        settings: RerouteSettings,
        org_id: str,
        outcome: str,
        reason: str,
        detail: str,
    ) -> None:
        """Offer a claimed job to the next candidate at `hop`, or hand its row back to local capacity.

        The offer that ended (at `hop - 1`) is recorded with `outcome`, `reason` and `detail`.
        """
        runs_on = _runs_on(dispatch)
        while hop <= settings.max_hops:
            link = self._link_for(self.choose(runs_on, tried), runs_on)
            if link is None:
                break
            async with self.db.transaction() as conn:
                await lock_job_for_change(conn, dispatch.job_id)
                now = await store.database_now(conn)
                moved = await store.move_claim(
                    conn,
                    job_id=dispatch.job_id,
                    attempt=dispatch.attempt,
                    from_agent=from_agent,
                    to_agent=link.agent_id,
                    owner=self.owner(),
                    now=now,
                    ack_deadline=now + timedelta(milliseconds=settings.ack_timeout_ms),
                    outcome=outcome,
                    detail=detail,
                    reason=reason,
                    ended_hop=hop - 1,
                )
            if not moved:
                # Cancelled, swept or finished meanwhile: nothing is left to route.
                self.job_secrets.pop(dispatch.job_id, None)
                return
            onward = dispatch.model_copy(update={"id": new_id()})
            if await self._send_offer(link, onward, hop=hop, tried=tried, settings=settings, org_id=org_id):
                return
            # Its session ended before the offer left: that worker counts as tried too.
            from_agent, tried, hop = link.agent_id, [*tried, link.worker], hop + 1
            outcome, reason, detail = "agent_lost", "session-gone", f"worker {link.worker}: session gone"
        await self._hand_back(
            dispatch.job_id,
            dispatch.run_id,
            dispatch.attempt,
            from_agent=from_agent,
            tried=tried,
            hop=hop - 1,
            outcome=outcome,
            reason=reason,
            detail=detail,
        )

    async def _hand_back(
        self,
        job_id: str,
        run_id: str,
        attempt: int,
        *,
        from_agent: str,
        tried: list[str],
        hop: int,
        outcome: str,
        reason: str,
        detail: str,
    ) -> None:
        """No hop or candidate left: the row goes back to `pending`, for coordinators' own agents and
        scalers only (`reroute_tried` set); the leader fails it `unroutable` after the grace."""
        self.job_secrets.pop(job_id, None)
        workers = ", ".join(tried[1:]) or "none"
        async with self.db.transaction() as conn:
            effects = await requeue(
                conn,
                job_id,
                outcome=outcome,
                detail=f"{detail}; no worker left to offer it to (tried: {workers})",
                now=utc_now(),
                max_attempts=self.max_attempts,
                agent_id=from_agent,
                attempt=attempt,
                reason=reason,
                reroute_hop=hop,
            )
            if effects is not None:
                await store.hand_back_to_local(conn, job_id, tried=tried, hop=hop)
        if effects is not None:
            log.info(
                "job %s goes back to local capacity after hop %d (workers tried: %s)",
                job_id,
                hop,
                workers,
                extra={"job_id": job_id, "run_id": run_id},
            )
        if effects and self.on_effects is not None:
            await self.on_effects(effects)
        self.dispatcher.wake()

    # --- spawn window, Layer A (docs/design/cluster.md §4.3)

    def arm_window(self, job_id: str, worker: str, delay_s: float) -> None:
        """(Re-)arm the in-memory timer mirroring the job's `reroute_window_expires_at`."""
        self.disarm_window(job_id)
        self.windows[job_id] = asyncio.create_task(
            self._window_timer(job_id, worker, max(0.0, delay_s)), name=f"reroute-window-{job_id}"
        )

    def disarm_window(self, job_id: str) -> None:
        """The job started, ended or was taken back: its timer stops (never the running timer itself)."""
        timer = self.windows.pop(job_id, None)
        if timer is not None and timer is not asyncio.current_task():
            timer.cancel()

    async def _window_timer(self, job_id: str, worker: str, delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        if self.windows.get(job_id) is asyncio.current_task():
            del self.windows[job_id]
        try:
            await self.window_lapsed(job_id, worker)
        except Exception:
            # The row decides, and it could not be read or written: look again shortly.
            log.exception("checking the spawn window of job %s failed; retrying", job_id)
            self.arm_window(job_id, worker, WINDOW_RETRY_S)

    async def window_lapsed(self, job_id: str, worker: str) -> bool:
        """Layer A on expiry: read the row; started, ended or held elsewhere → nothing; a window
        re-armed to a later deadline → wait for it; still not started → re-dispatch
        (docs/design/cluster.md §4.4)."""
        async with self.db.read() as conn:
            now = await store.database_now(conn)
            holder = await store.reroute_holder(conn, job_id)
        if holder is None or holder.rerouted_to != worker or holder.window_expires_at is None:
            return False
        if holder.window_expires_at > now:
            self.arm_window(job_id, worker, (holder.window_expires_at - now).total_seconds())
            return False
        return await self.redispatch(job_id, worker, "window", "spawn window lapsed", lapsed_by=now)

    async def rearm_windows(self) -> int:
        """At start: a timer for each armed window of the jobs this coordinator's claims hold (a
        restart loses the in-memory ones; the rows keep the deadlines)."""
        async with self.db.read() as conn:
            now = await store.database_now(conn)
            armed = await store.armed_windows(conn, owner=self.owner())
        for window in armed:
            self.arm_window(window.job_id, window.worker, (window.expires_at - now).total_seconds())
        return len(armed)

    async def sweep_lapsed_windows(
        self,
        instance_window: timedelta,
        transaction: Callable[[], AbstractAsyncContextManager[AsyncConnection]] | None = None,
    ) -> int:
        """The leader's sweep: Layer A for lapsed windows whose owning coordinator is not live in
        `cluster_instances` (a live owner's own timer decides); how many jobs it took back. Each
        take-back runs in `transaction` (the leader's fenced one)."""
        async with self.db.read() as conn:
            now = await store.database_now(conn)
            lapsed = await store.armed_windows(conn, lapsed_by=now)
            if not lapsed:
                return 0
            live = {
                row.instance_id
                for row in await instance_store.list_instances(conn)
                if now - row.last_heartbeat_at <= instance_window
            }
        taken = 0
        for window in lapsed:
            if window.owner in live:
                continue
            detail = f"spawn window lapsed and its coordinator {window.owner or 'unknown'} is not live"
            if await self.redispatch(
                window.job_id, window.worker, "window", detail, lapsed_by=now, transaction=transaction
            ):
                taken += 1
        return taken

    # --- re-dispatch (docs/design/cluster.md §4.4)

    async def redispatch(
        self,
        job_id: str,
        worker: str,
        reason: str,
        detail: str,
        *,
        lapsed_by: datetime | None = None,
        transaction: Callable[[], AbstractAsyncContextManager[AsyncConnection]] | None = None,
    ) -> bool:
        """Take a not-yet-started job back from `worker` and send it onwards; whether this call won.

        One conditional update decides among Layer A (the window timer), Layer B (a relayed spawn
        failure) and the leader's sweep. The winner cancels the job on the old worker (best effort),
        appends it to `tried` and offers the same job to the next candidate with `hop + 1`, or hands
        the row back to local capacity. `reason` is the metric's (`window`, `final`, `cap`). The
        leader's sweep passes its fenced `transaction`, so a deposed leader takes nothing back.
        """
        async with (transaction or self.db.transaction)() as conn:
            await lock_job_for_change(conn, job_id)
            taken = await store.take_back(conn, job_id, worker, lapsed_by=lapsed_by)
        if taken is None:
            return False
        self.disarm_window(job_id)
        self.metrics.redispatches.labels(reason).inc()
        log.warning(
            "took job %s back from worker %s (%s): %s",
            job_id,
            worker,
            reason,
            detail,
            extra={"job_id": job_id, "run_id": taken.run_id},
        )
        await self._send(
            worker, JobCancelRequest(run_id=taken.run_id, job_id=job_id, reason="rerouted", force=True)
        )
        self.job_secrets.pop(job_id, None)
        from_agent = taken.claim_agent or worker_agent_id(worker)
        tried = [*(taken.tried or [self.owner()]), worker]
        outcome, why = "taken_back", f"worker {worker}: {detail}"
        try:
            dispatch = await self.dispatcher.build_dispatch(Claim(job_id, taken.run_id, taken.attempt))
        except Exception:
            log.exception("rebuilding the dispatch of job %s failed; it goes back to the queue", job_id)
            await self._hand_back(
                job_id,
                taken.run_id,
                taken.attempt,
                from_agent=from_agent,
                tried=tried,
                hop=taken.hop,
                outcome=outcome,
                reason=reason,
                detail=why,
            )
            return True
        if dispatch is None:
            return True  # it may not run any more: the build failed it
        await self._route_onwards(
            dispatch,
            from_agent=from_agent,
            tried=tried,
            hop=taken.hop + 1,
            settings=await self.settings(taken.org_id),
            org_id=taken.org_id,
            outcome=outcome,
            reason=reason,
            detail=why,
        )
        return True

    def ack_arrived(self, sender: str, ack: JobRerouteAck) -> None:
        """An offer's ack was read: stop its timer now. The ack is applied later, in arrival order behind
        the session's other job-path messages, and a slow database write among those (a result waiting on a
        run's lock) must not make it look late: the job would go onwards while this worker runs it."""
        offer = self.pending.get(ack.message_id)
        if offer is None or offer.link.worker != sender or offer.job_id != ack.job_id:
            return
        if offer.timer is not None and offer.timer is not asyncio.current_task():
            offer.timer.cancel()
            offer.timer = None

    async def on_ack(self, sender: str, ack: JobRerouteAck) -> None:
        """A worker's answer to an offer: record the holder, or offer the job onwards."""
        offer = self.pending.get(ack.message_id)
        if offer is None or offer.link.worker != sender or offer.job_id != ack.job_id:
            log.info("ignored an unexpected job.reroute.ack from %s for job %s", sender, ack.job_id)
            if ack.accepted:
                # It accepted after its offer timed out (the job went onwards): it must not run the job,
                # whatever became of the ack timeout's own cancel (docs/design/cluster.md §4.2).
                await self._cancel_unless_holder(sender, ack.job_id)
            return
        if not ack.accepted:
            self._forget_offer(ack.message_id)
            self.metrics.offers.labels(ack.reason or "nak").inc()
            log.info("worker %s refused job %s: %s", sender, ack.job_id, ack.reason)
            # The reason is the worker's word: it is cut to fit `dispatch_history.reason`.
            reason = (ack.reason or "nak")[:HISTORY_REASON_MAX]
            await self._refused(offer, "rejected", reason, f"worker {sender}: {ack.reason or 'refused'}")
            return
        # The offer is forgotten only once the holder is recorded: a transaction the database ends is
        # retried with the same ack (the peer hub), which must still find its offer (its timer stopped).
        self.ack_arrived(sender, ack)
        async with self.db.transaction() as conn:
            now = await store.database_now(conn)
            held = await store.mark_rerouted(
                conn,
                job_id=offer.job_id,
                claimed_by=offer.link.agent_id,
                attempt=offer.attempt,
                worker=sender,
                hop=offer.hop,
                tried=offer.tried,
                spawn_max_attempts=offer.settings.spawn_max_attempts,
                spawn_retry_backoff_ms=offer.settings.spawn_retry_backoff_ms,
                window_expires_at=now + timedelta(milliseconds=offer.settings.spawn_window_ms),
            )
        self._forget_offer(ack.message_id)
        self.backoff.ack(sender)
        # The worker's next heartbeat counts this job; until then its room stays spoken for.
        offer.link.in_flight += 1
        self.metrics.offers.labels("accepted").inc()
        if held:
            self.arm_window(offer.job_id, sender, offer.settings.spawn_window_ms / 1000)
            self._cancel_loop.wake()  # a job cancelled while its offer waited is cancelled there at once
        else:
            # Given back or cancelled meanwhile: the worker must not run it.
            self.job_secrets.pop(offer.job_id, None)
            await self._send(
                sender,
                JobCancelRequest(run_id=offer.run_id, job_id=offer.job_id, reason="rerouted", force=True),
            )

    async def _cancel_unless_holder(self, worker: str, job_id: str) -> None:
        """`job.cancel` (taken back) to `worker` unless the job's row names it as the holder."""
        async with self.db.read() as conn:
            holder = await store.reroute_holder(conn, job_id)
        if holder is None or holder.rerouted_to == worker:
            return
        await self._send(
            worker, JobCancelRequest(run_id=holder.run_id, job_id=job_id, reason="rerouted", force=True)
        )

    # --- what workers report

    async def _secrets(self, conn: AsyncConnection, job_id: str) -> list[str]:
        """The job's secret values (call only for a job the reporting worker holds: they are kept)."""
        values = self.job_secrets.get(job_id)
        if values is None and self.secret_values is not None:
            values = self.job_secrets[job_id] = await self.secret_values(conn, job_id)
        return values or []

    async def _masker(self, conn: AsyncConnection, job_id: str) -> Masker:
        """A masker of the job's secret values (as `_secrets`)."""
        return masker_for(tuple(await self._secrets(conn, job_id)))

    async def on_progress(self, sender: str, message: JobProgress) -> None:
        """Apply a worker's progress (guarded by `rerouted_to` = sender); ack terminal progress after commit."""
        effects: Effects | None = None
        at = _parse_time(message.at)
        async with self.db.transaction() as conn:
            await lock_job_for_change(conn, message.job_id)
            holder = await store.reroute_holder(conn, message.job_id)
            applies = (
                holder is not None and holder.rerouted_to == sender and holder.status not in JOB_TERMINAL
            )
            if not applies:
                log.info(
                    "progress %s of job %s from %s changed nothing (a replay, or not its holder)",
                    message.state,
                    message.job_id,
                    sender,
                    extra={"job_id": message.job_id},
                )
            elif message.terminal:
                masker = await self._masker(conn, message.job_id)
                for step in message.final_steps or []:
                    values = _step_values(step, masker)
                    await record_step(conn, message.job_id, int(step["step_index"]), **values)
                await _record_agent(conn, message.job_id, message.data.get("agent_id"))
                # Its "running" progress may have been lost: the end disarms the spawn window too.
                await store.disarm_reroute_window(conn, message.job_id)
                effects = await finish_job(
                    conn,
                    message.job_id,
                    message.state,
                    reason=message.data.get("reason"),
                    outputs=masker.mask_json(message.data.get("outputs")),
                )
                log.info(
                    "applied the terminal result of job %s from worker %s: %s",
                    message.job_id,
                    sender,
                    message.state,
                    extra={"job_id": message.job_id},
                )
            elif message.kind == "job" and message.state == "running":
                assert holder is not None
                await store.disarm_reroute_window(conn, message.job_id)
                await start_job(conn, message.job_id, holder.agent_id or worker_agent_id(sender), at)
                await _record_agent(conn, message.job_id, message.data.get("agent_id"))
            elif message.kind == "step" and message.step_index is not None:
                masker = await self._masker(conn, message.job_id)
                await record_step(
                    conn,
                    message.job_id,
                    message.step_index,
                    **_step_values({**message.data, "status": message.state}, masker),
                    **({"started_at": at} if message.state == "running" else {"finished_at": at}),
                )
        if not applies and not message.terminal and holder is not None and holder.rerouted_to != sender:
            # A worker runs a job it does not hold (it accepted an offer that had timed out, or was taken
            # back while cut off): stop it there, as an agent's job owned by another gets `not_owned`.
            await self._send(
                sender,
                JobCancelRequest(run_id=holder.run_id, job_id=message.job_id, reason="rerouted", force=True),
            )
        if applies and (message.terminal or (message.kind == "job" and message.state == "running")):
            self.disarm_window(message.job_id)
        if message.terminal:
            self.job_secrets.pop(message.job_id, None)
            if self._withhold_acks > 0:
                self._withhold_acks -= 1
                log.warning("test hook: withheld the progress ack of job %s", message.job_id)
            else:
                await self._send(sender, JobProgressAck(job_id=message.job_id, state=message.state))
        self.on_job_changed(message.job_id)
        if effects is not None and self.on_effects is not None:
            await self.on_effects(effects)

    async def on_log_chunk(self, sender: str, chunk: LogChunkRelay) -> None:
        """Store a relayed chunk of a job this worker holds (duplicates by seq are dropped by the store)."""
        if self.append_log is None:
            return
        lines = [p.LogLine.model_validate(line) for line in chunk.lines]
        agent_chunk = p.LogChunk(job_id=chunk.job_id, step_index=chunk.step_index, seq=chunk.seq, lines=lines)
        async with self.db.transaction() as conn:
            holder = await store.reroute_holder(conn, chunk.job_id)
            if holder is None or holder.rerouted_to != sender:
                log.info(
                    "dropped a log chunk of job %s from %s, which does not hold it", chunk.job_id, sender
                )
                return
            await self.append_log(conn, agent_chunk, await self._secrets(conn, chunk.job_id))
        self.on_job_changed(chunk.job_id)

    async def on_event_emit(self, sender: str, emit: EventEmitRelay) -> None:
        """Relay a worker agent's `event.emit` to the event router; answer with `.result`."""
        async with self.db.read() as conn:
            holder = await store.reroute_holder(conn, emit.job_id)
            held = holder is not None and holder.rerouted_to == sender
            masker = await self._masker(conn, emit.job_id) if held else None
        emitter = self.event_emitter()
        if holder is None or holder.rerouted_to != sender:
            error: dict[str, Any] | None = {
                "code": "not_owned",
                "detail": "the job is not held by this worker",
            }
            result = EventEmitResultRelay(job_id=emit.job_id, request_id=emit.request_id, error=error)
        elif emitter is None:
            error = {"code": "events_disabled", "detail": "events are not enabled on this node"}
            result = EventEmitResultRelay(job_id=emit.job_id, request_id=emit.request_id, error=error)
        else:
            answer = await emitter(
                holder.agent_id or worker_agent_id(sender),
                p.EventEmit(
                    oseq=0,
                    request_id=emit.request_id,
                    job_id=emit.job_id,
                    name=emit.name,
                    payload=masker.mask_json(emit.payload) if masker is not None else {},
                    target_repos=emit.target_repos,
                ),
            )
            result = EventEmitResultRelay(
                job_id=emit.job_id,
                request_id=emit.request_id,
                event_id=answer.event_id,
                created=answer.created,
                error=answer.error.model_dump(mode="json") if answer.error else None,
            )
        await self._send(sender, result)

    async def on_scaler_event(self, sender: str, event: ScalerEventRelay) -> None:
        """A worker's scaler report for a rerouted job; a spawn failure goes through Layer B
        (docs/design/cluster.md §4.3).

        Provenance is `sender`, the relaying session's authenticated instance id, never a field of
        the message: only the job's holder's relays are recorded or acted on.
        """
        if event.kind != "failed":
            log.info("worker %s: %s for job %s: %s", sender, event.kind, event.job_id, event.detail)
            return
        async with self.db.read() as conn:
            known = await store.spawn_budget(conn, event.job_id)
        if known is None or known.rerouted_to != sender:
            log.info(
                "ignored a spawn failure of job %s relayed by %s, which does not hold it",
                event.job_id,
                sender,
            )
            return
        window_ms = (await self.settings(known.org_id)).spawn_window_ms
        attempt = f"attempt {event.attempt}" if event.attempt is not None else "a spawn attempt"
        error = f"worker {sender}: {attempt} failed: {event.detail}"
        async with self.db.transaction() as conn:
            await lock_job_for_change(conn, event.job_id)
            now = await store.database_now(conn)
            budget = await store.spawn_budget(conn, event.job_id)
            if budget is None:
                return
            verdict = on_relayed_spawn_failure(
                sender=sender,
                holder=budget.rerouted_to,
                status=budget.status,
                window_expires_at=budget.window_expires_at,
                final=event.final,
                failures=budget.failures,
                max_attempts=budget.max_attempts,
                backoff_ms=budget.backoff_ms,
                spawn_window_ms=window_ms,
                now=now,
            )
            if verdict.action != "ignore":
                await store.record_spawn_failure(conn, event.job_id, error)
                await timeline(
                    conn,
                    budget.run_id,
                    event.job_id,
                    "scaler",
                    "scaler.failed",
                    {"worker": sender, "attempt": event.attempt, "final": event.final, "error": event.detail},
                )
            if verdict.failures is not None:
                await store.count_spawn_failure(
                    conn,
                    event.job_id,
                    sender,
                    failures=verdict.failures,
                    window_expires_at=verdict.window_expires_at,
                )
        log.info("job %s: %s (%s)", event.job_id, error, verdict.action, extra={"job_id": event.job_id})
        if verdict.action == "rearm" and verdict.window_expires_at is not None:
            self.arm_window(event.job_id, sender, (verdict.window_expires_at - now).total_seconds())
        elif verdict.action == "redispatch":
            why = "gave the job back" if verdict.reason == "final" else "spawn attempts used up"
            await self.redispatch(event.job_id, sender, verdict.reason or "final", f"{why}: {event.detail}")

    async def handle(self, sender: str, message: Any) -> bool:
        """Route one job-path message from a worker session; False when it is not one."""
        if isinstance(message, JobRerouteAck):
            await self.on_ack(sender, message)
        elif isinstance(message, JobProgress):
            await self.on_progress(sender, message)
        elif isinstance(message, LogChunkRelay):
            await self.on_log_chunk(sender, message)
        elif isinstance(message, EventEmitRelay):
            await self.on_event_emit(sender, message)
        elif isinstance(message, ScalerEventRelay):
            await self.on_scaler_event(sender, message)
        elif isinstance(message, PeerError) and message.message_id in self.pending:
            # The worker could not read the offer: a NAK `invalid`.
            offer = self.pending[message.message_id]
            await self.on_ack(
                sender,
                JobRerouteAck(
                    message_id=message.message_id, job_id=offer.job_id, accepted=False, reason="invalid"
                ),
            )
        else:
            return False
        return True

    async def _send(self, worker: str, message: Any) -> None:
        session = self.peers.session_for(worker)
        if session is None:
            if isinstance(message, JobCancelRequest):
                await self._relay_cancel(worker, message)
            return
        with contextlib.suppress(Exception):
            await session.send(message)

    async def _relay_cancel(self, worker: str, cancel: JobCancelRequest) -> None:
        """A worker not connected here may be connected to a sibling (the owner is gone and the leader
        sweeps): every connected coordinator passes the cancel on if it holds a session with it."""
        for sibling in self.peers.connected("coordinator"):
            session = self.peers.session_for(sibling)
            if session is None:
                continue
            with contextlib.suppress(Exception):
                await session.send(JobCancelRelay(worker=worker, cancel=cancel))

    async def on_cancel_relay(self, session: Any, message: JobCancelRelay) -> None:
        """A sibling coordinator's `job.cancel.relay`: pass the cancel to the worker if it is connected here."""
        if session.peer_role != "coordinator":
            log.warning("ignored job.cancel.relay from %s: accepted from coordinators only", session.peer_id)
            return
        target = self.peers.session_for(message.worker)
        if target is not None and target.peer_role == "worker":
            with contextlib.suppress(Exception):
                await target.send(message.cancel)


async def _record_agent(conn: AsyncConnection, job_id: str, agent_id: Any) -> None:
    """Name the worker's agent that runs the job (the claim named only the worker)."""
    if isinstance(agent_id, str) and agent_id:
        await store.set_job_agent(conn, job_id, agent_id[:64])


def _runs_on(dispatch: JobDispatch) -> dict[str, Any]:
    return dict(dispatch.job.get("runs_on") or {})


def _any_capacity(worker: WorkerView) -> WorkerCapacity:
    """A worker's total free capacity, whatever the labels (the order of its links)."""
    slots = sum(max(0, a.capacity - a.active_jobs) for a in worker.agents)
    room = sum(max(0, s.max_agents - s.active) for s in worker.scalers)
    return WorkerCapacity(worker.instance_id, slots, room)


_STEP_FIELDS = (
    "name",
    "kind",
    "lock_index",
    "status",
    "reason",
    "exit_code",
    "outputs",
    "attempts",
    "error",
    "duration_ms",
)


def _step_values(step: Mapping[str, Any], masker: Masker) -> dict[str, Any]:
    """The `steps` columns a progress message may set, its outputs and error masked."""
    values = {name: step[name] for name in _STEP_FIELDS if step.get(name) is not None}
    if "outputs" in values:
        values["outputs"] = masker.mask_json(values["outputs"])
    if "error" in values:
        values["error"] = masker.mask(str(values["error"]))
    return values


def _parse_time(value: str) -> datetime:
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return utc_now()
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
