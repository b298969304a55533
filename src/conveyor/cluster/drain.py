"""Drain and shutdown (docs/design/cluster.md §8): the node's drain flag, peer drain requests, the worker's
SIGTERM order.

- `NodeDrain` is the in-memory flag (a restarted node comes back accepting). Every node publishes one
  as `state.parts["drain"]` (`SERVICE_KEY`; find it with `node_drain(state.parts)`). While it is
  set the node advertises `draining` (peer heartbeat, `cluster_instances`), its dispatcher claims no
  `dispatch_queue` row, its scaler spawns nothing, and a worker NAKs reroutes with `draining`.
- `DrainableJobs` is what the shutdown needs of the jobs a worker holds; the job path provides it and
  is assigned to `NodeDrain.jobs` (the default, `NoJobs`, holds nothing).
- `WorkerShutdown` is the worker's SIGTERM order: drain, give back held jobs, wait for running jobs
  (then cancel the rest), flush the outbox. The peer hub stops after it and sends `peer.leaving`.
- `drain_request_handler` answers `peer.drain.request` on any node.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from conveyor.cluster.messages import DrainRequest, DrainResponse, PeerError, PeerMessage
from conveyor.cluster.peer import PeerSession
from conveyor.parts import PartKey, Parts

log = logging.getLogger(__name__)

# How long the coordinator waits for a peer's `peer.drain.response` (docs/design/admin.md: no answer → 504).
PEER_DRAIN_TIMEOUT_S = 15.0
# Acks of terminal results get this long at shutdown (docs/design/cluster.md §8 step 4).
OUTBOX_FLUSH_TIMEOUT_S = 10.0
# How often the shutdown re-counts running jobs while it waits for them to finish.
RUNNING_POLL_S = 0.1

DrainAction = Literal["drain", "resume"]


class DrainableJobs(Protocol):
    """The jobs a node holds, as its shutdown needs them (the worker's job path implements this)."""

    def held_jobs_not_started(self) -> list[str]:
        """Ids of jobs this node accepted but has not started (no agent runs them yet)."""
        ...

    async def give_back(self, job_id: str, detail: str) -> object:
        """Hand a not-started job back to its coordinator (`scaler.event {kind: failed, final: true}`)."""
        ...

    def running_jobs_count(self) -> int:
        """How many jobs an agent of this node runs right now."""
        ...

    async def cancel_running(self, reason: str) -> object:
        """Cancel every job still running (status `cancelled`, with `reason`)."""
        ...

    async def flush_outbox(self, timeout_s: float) -> object:
        """Wait up to `timeout_s` seconds for the outbox's terminal results to be acked."""
        ...


class NoJobs:
    """`DrainableJobs` of a node that holds no jobs: nothing to give back, wait for or flush."""

    def held_jobs_not_started(self) -> list[str]:
        """None held."""
        return []

    async def give_back(self, job_id: str, detail: str) -> None:
        """Nothing to give back."""

    def running_jobs_count(self) -> int:
        """None running."""
        return 0

    async def cancel_running(self, reason: str) -> None:
        """Nothing to cancel."""

    async def flush_outbox(self, timeout_s: float) -> None:
        """Nothing to flush."""


@dataclass
class NodeDrain:
    """This node's drain flag (docs/design/cluster.md §8), and the jobs it holds.

    `draining` is the flag; `drain()` and `resume()` set and clear it (each returns whether it changed),
    `jobs_running()` counts through `jobs`. `on_change` callbacks run after each change (e.g. to wake
    the dispatcher so it notices a resume at once).
    """

    jobs: DrainableJobs = field(default_factory=NoJobs)
    draining: bool = False
    on_change: list[Callable[[bool], None]] = field(default_factory=list)

    def drain(self, reason: str = "admin") -> bool:
        """Stop taking new work; whether the flag changed."""
        if self.draining:
            return False
        self.draining = True
        log.info("draining: this node takes no new work (%s)", reason)
        self._changed()
        return True

    def resume(self) -> bool:
        """Take new work again; whether the flag changed."""
        if not self.draining:
            return False
        self.draining = False
        log.info("resumed: this node takes new work again")
        self._changed()
        return True

    def apply(self, action: DrainAction, reason: str = "admin") -> bool:
        """`drain()` or `resume()` by name."""
        return self.drain(reason) if action == "drain" else self.resume()

    def jobs_running(self) -> int:
        """Jobs this node runs right now."""
        try:
            return self.jobs.running_jobs_count()
        except Exception:  # a status read must not fail because a counter did
            log.exception("could not count running jobs")
            return 0

    def status(self, instance_id: str | None) -> dict[str, Any]:
        """`{instance_id, draining, jobs_running}`, the body of the drain routes."""
        return {"instance_id": instance_id, "draining": self.draining, "jobs_running": self.jobs_running()}

    def _changed(self) -> None:
        for callback in self.on_change:
            try:
                callback(self.draining)
            except Exception:
                log.exception("a drain callback failed")


DRAIN = PartKey[NodeDrain]("drain")
"""The node's drain flag, once its cluster hook has started."""
WORKER_SHUTDOWN = PartKey["WorkerShutdown"]("worker_shutdown")


def on_shutdown_signal(parts: Parts, *, first: bool) -> None:
    """SIGTERM/SIGINT: the first drains this node at once; a second one forces a worker's shutdown."""
    if first:
        drain = parts.get(DRAIN)
        if drain is not None:
            drain.drain(reason="shutdown")
        return
    shutdown = parts.get(WORKER_SHUTDOWN)
    if shutdown is not None:
        shutdown.force()


async def run_worker_shutdown(parts: Parts) -> None:
    """Run the worker's shutdown order now (the first signal), while its agents' sockets still serve."""
    shutdown = parts.get(WORKER_SHUTDOWN)
    if shutdown is not None:
        await shutdown.run()


def drain_request_handler(drain: NodeDrain) -> Callable[[PeerSession, DrainRequest], Awaitable[PeerMessage]]:
    """The `peer.drain.request` answer: only a coordinator may drain or resume this node."""

    async def answer(session: PeerSession, message: DrainRequest) -> PeerMessage:
        if session.peer_role != "coordinator":
            log.warning("refused a drain request from %s (%s)", session.peer_id, session.peer_role)
            return PeerError(
                message_id=message.message_id, error="forbidden", detail="only coordinators may drain a peer"
            )
        drain.apply(message.action, reason=f"requested by {session.peer_id}")
        return DrainResponse(
            message_id=message.message_id, draining=drain.draining, jobs_running=drain.jobs_running()
        )

    return answer


def bearer_matches(header: str | None, expected: str) -> bool:
    """Whether an `Authorization` header carries `Bearer <expected>` (constant-time on the token)."""
    scheme, _, given = (header or "").partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(given.strip().encode(), expected.encode())


# --- the worker's SIGTERM order


ShutdownStep = Literal["drained", "gave_back", "waited", "cancelled", "flushed", "forced"]


@dataclass
class WorkerShutdown:
    """The worker's shutdown (docs/design/cluster.md §8), run as a component stopped before the peer hub.

    1. drain; 2. give back every held job not yet started ("worker shutting down"); 3. wait up to
    `drain_timeout_ms` for running jobs, then cancel the rest (reason `worker_shutdown`); 4. flush the
    outbox (≤ `outbox_flush_s`). The hub, stopped next, sends `peer.leaving`. `force()` (a second
    SIGTERM/SIGINT) ends whatever step runs and skips the rest: the outbox stays on disk and replays at
    the next start.
    """

    drain: NodeDrain
    drain_timeout_ms: int
    outbox_flush_s: float = OUTBOX_FLUSH_TIMEOUT_S
    poll_s: float = RUNNING_POLL_S
    clock: Callable[[], float] = time.monotonic
    steps: list[ShutdownStep] = field(default_factory=list)
    _forced: asyncio.Event = field(default_factory=asyncio.Event)

    async def start(self) -> None:
        """Nothing runs until shutdown."""

    def force(self) -> None:
        """Skip what is left of the shutdown (a second signal)."""
        if not self._forced.is_set():
            log.warning("second signal: shutting down at once; the outbox replays at the next start")
        self._forced.set()

    @property
    def forced(self) -> bool:
        """Whether the shutdown was told to skip its remaining steps."""
        return self._forced.is_set()

    async def stop(self) -> None:
        """Run the shutdown order unless the first signal already ran it (the component protocol's stop)."""
        if not self.steps:
            await self.run()

    async def run(self) -> list[ShutdownStep]:
        """Drain, give back, wait, cancel, flush; the steps taken, in order."""
        if self.steps:  # once per process: the signal runs it, the component stop then has nothing to do
            return self.steps
        jobs = self.drain.jobs
        self.drain.drain(reason="shutdown")
        self.steps.append("drained")
        for job_id in [] if self.forced else jobs.held_jobs_not_started():
            if self.forced:
                break
            try:
                await self._unless_forced(jobs.give_back(job_id, "worker shutting down"))
            except Exception:
                log.exception("could not give back job %s at shutdown", job_id)
        if not self.forced:
            self.steps.append("gave_back")
        if not self.forced and await self._wait_for_running_jobs():
            self.steps.append("waited")
        elif not self.forced:
            left = self.drain.jobs_running()
            log.warning("%d jobs still run after %d ms; cancelling them", left, self.drain_timeout_ms)
            try:
                await self._unless_forced(jobs.cancel_running("worker_shutdown"))
            except Exception:
                log.exception("could not cancel the running jobs at shutdown")
            self.steps.append("cancelled")
        if not self.forced:
            try:
                await self._unless_forced(jobs.flush_outbox(self.outbox_flush_s))
            except Exception:
                log.exception("could not flush the outbox at shutdown")
        if self.forced:
            self.steps.append("forced")
        else:
            self.steps.append("flushed")
        return self.steps

    async def _wait_for_running_jobs(self) -> bool:
        """Until no job runs (True), the drain timeout passes or the shutdown is forced (False)."""
        deadline = self.clock() + self.drain_timeout_ms / 1000
        while self.drain.jobs_running() > 0:
            left = deadline - self.clock()
            if left <= 0 or self.forced:
                return False
            # Polled: `DrainableJobs` offers a count, not a notification. The forced event ends the wait early.
            try:
                async with asyncio.timeout(min(self.poll_s, left)):
                    await self._forced.wait()
            except TimeoutError:
                pass
        return not self.forced

    async def _unless_forced(self, step: Awaitable[object]) -> None:
        """Run one step, abandoning it when the shutdown is forced."""
        task = asyncio.ensure_future(step)
        forced = asyncio.ensure_future(self._forced.wait())
        try:
            await asyncio.wait({task, forced}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            forced.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            return
        task.result()
