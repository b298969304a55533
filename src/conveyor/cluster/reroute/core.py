"""What every part of the coordinator's reroute service shares (docs/design/cluster.md §4): its state,
its metrics, worker capacity in the dispatcher (`WorkerLink`), relaying cancels, and sending to a worker.

The parts (`offers.py`, `windows.py`, `reports.py`) each add one concept's methods to `RerouteCore`;
`service.RerouteService` is their sum. The few methods one part calls in another are declared abstract here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter
from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.cluster import store
from conveyor.cluster.messages import JobCancelRelay, JobCancelRequest
from conveyor.cluster.reroute.policy import (
    CapacityUnit,
    NakBackoff,
    WorkerCapacity,
    WorkerView,
    capacity_units,
    worker_agent_id,
    worker_rank,
    worker_wait_note,
)
from conveyor.cluster.reroute.settings import RerouteSettings
from conveyor.db.engine import Database
from conveyor.execution.dispatcher import Dispatcher
from conveyor.execution.lifecycle import Effects
from conveyor.execution.logs import DispatchAttempt
from conveyor.execution.queue import AgentSlot
from conveyor.model import protocol as p
from conveyor.model.knobs import CLUSTER_KNOBS_BY_NAME
from conveyor.model.protocol import JobDispatch
from conveyor.runtime.loops import WakeableLoop

log = logging.getLogger(__name__)

TEST_WITHHOLD_ACKS_ENV = "CONVEYOR_TEST_WITHHOLD_PROGRESS_ACKS"


@dataclass(frozen=True)
class RerouteMetrics:
    """`conveyor_reroute_total{outcome}`, `conveyor_reroute_redispatch_total{reason}` and
    `conveyor_reroute_ownership_deferrals_total`, in a registry."""

    offers: Counter
    redispatches: Counter
    ownership_deferrals: Counter

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
            Counter(
                "conveyor_reroute_ownership_deferrals_total",
                "Spawn-window checks deferred: the job's rows stayed locked past ownership_db_check_timeout_ms",
                registry=registry,
            ),
        )


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

    service: RerouteCore
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


async def _default_ownership_check_timeout() -> int:
    return int(CLUSTER_KNOBS_BY_NAME["ownership_db_check_timeout_ms"].default or 0)


class RerouteCore(ABC):
    """Coordinator side of rerouting: the state its parts share, worker capacity, cancels, sends."""

    def __init__(
        self,
        db: Database,
        dispatcher: Dispatcher,
        peers: PeerSender,
        *,
        owner: Callable[[], str],
        settings: Callable[[str], Awaitable[RerouteSettings]],
        max_attempts: int,
        append_log: Callable[[AsyncConnection, p.LogChunk, list[str], DispatchAttempt | None], Awaitable[Any]]
        | None = None,
        event_emitter: Callable[[], Callable[[str, p.EventEmit], Awaitable[p.EventEmitResult]] | None] = (
            lambda: None
        ),
        on_effects: Callable[[Effects], Awaitable[None]] | None = None,
        on_job_changed: Callable[[str], None] = lambda _job_id: None,
        secret_values: Callable[[AsyncConnection, str], Awaitable[list[str]]] | None = None,
        clock: Callable[[], float] = time.monotonic,
        metrics: RerouteMetrics | None = None,
        cancel_poll_s: float = 1.0,
        ownership_check_timeout_ms: Callable[[], Awaitable[int]] | None = None,
    ) -> None:
        self.db = db
        # `ownership_db_check_timeout_ms`, read live (docs/design/cluster.md §4.4).
        self.ownership_check_timeout_ms = ownership_check_timeout_ms or _default_ownership_check_timeout
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

    # --- what one part calls in another

    @abstractmethod
    async def offer(self, link: WorkerLink, dispatch: JobDispatch) -> bool:
        """Send `job.reroute` for a job the dispatcher claimed for `link` (`offers.py`)."""

    @abstractmethod
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
        """Offer a claimed job to the next candidate, or hand it back to local capacity (`offers.py`)."""

    @abstractmethod
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
        """The row goes back to `pending` for local capacity only (`offers.py`)."""

    @abstractmethod
    async def rearm_windows(self) -> int:
        """At start: a timer for each armed window of the jobs this coordinator holds (`windows.py`)."""

    @abstractmethod
    def arm_window(self, job_id: str, worker: str, delay_s: float) -> None:
        """(Re-)arm the job's spawn-window timer (`windows.py`)."""

    @abstractmethod
    def disarm_window(self, job_id: str) -> None:
        """Stop the job's spawn-window timer (`windows.py`)."""

    @abstractmethod
    async def redispatch(
        self,
        job_id: str,
        worker: str,
        reason: str,
        detail: str,
        *,
        lapsed_by: datetime | None = None,
        transaction: Callable[[], contextlib.AbstractAsyncContextManager[AsyncConnection]] | None = None,
    ) -> bool:
        """Take a not-yet-started job back from `worker` and send it onwards (`windows.py`)."""


def _any_capacity(worker: WorkerView) -> WorkerCapacity:
    """A worker's total free capacity, whatever the labels (the order of its links)."""
    slots = sum(max(0, a.capacity - a.active_jobs) for a in worker.agents)
    room = sum(max(0, s.max_agents - s.active) for s in worker.scalers)
    return WorkerCapacity(worker.instance_id, slots, room)
