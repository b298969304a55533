"""Drain and shutdown (docs/design/cluster.md §8): the flag, peer drain requests, the worker's SIGTERM
order."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from conveyor.cluster.drain import (
    DRAIN,
    WORKER_SHUTDOWN,
    NodeDrain,
    NoJobs,
    WorkerShutdown,
    bearer_matches,
    drain_request_handler,
    on_shutdown_signal,
)
from conveyor.cluster.messages import DrainRequest, DrainResponse, PeerError
from conveyor.cluster.peer import PeerSession
from conveyor.parts import Parts


def test_drain_and_resume_report_whether_the_flag_changed_and_tell_the_callbacks() -> None:
    seen: list[bool] = []
    drain = NodeDrain(on_change=[seen.append])
    assert drain.drain() is True and drain.draining
    assert drain.drain() is False
    assert drain.resume() is True and not drain.draining
    assert drain.resume() is False
    assert seen == [True, False]


def test_the_status_counts_running_jobs_through_the_job_path() -> None:
    jobs = FakeJobs(running=3)
    drain = NodeDrain(jobs=jobs)
    drain.apply("drain")
    assert drain.status("w1") == {"instance_id": "w1", "draining": True, "jobs_running": 3}
    assert NodeDrain().status(None)["jobs_running"] == 0


@pytest.mark.parametrize(
    ("header", "ok"),
    [
        ("Bearer s3cret", True),
        ("bearer s3cret", True),
        ("Bearer s3cret2", False),
        ("Bearer ", False),
        ("s3cret", False),
        ("Basic s3cret", False),
        (None, False),
    ],
)
def test_the_worker_admin_token_must_be_the_bearer(header: str | None, ok: bool) -> None:
    assert bearer_matches(header, "s3cret") is ok


class FakeSession:
    def __init__(self, peer_role: str) -> None:
        self.peer_id = "c1"
        self.peer_role = peer_role
        self.sent: list[Any] = []

    async def send(self, message: Any) -> None:
        self.sent.append(message)


async def test_a_coordinator_drain_request_drains_and_is_answered_with_the_state() -> None:
    drain = NodeDrain(jobs=FakeJobs(running=1))
    session = FakeSession("coordinator")
    answer = drain_request_handler(drain)
    drained = await answer(cast(PeerSession, session), DrainRequest(message_id="m1", action="drain"))
    assert isinstance(drained, DrainResponse) and drain.draining
    resumed = await answer(cast(PeerSession, session), DrainRequest(message_id="m2", action="resume"))
    assert isinstance(resumed, DrainResponse) and not drain.draining
    assert [(r.message_id, r.draining, r.jobs_running) for r in (drained, resumed)] == [
        ("m1", True, 1),
        ("m2", False, 1),
    ]


async def test_a_drain_request_from_a_worker_is_refused() -> None:
    drain = NodeDrain()
    session = FakeSession("worker")
    answer = await drain_request_handler(drain)(
        cast(PeerSession, session), DrainRequest(message_id="m1", action="drain")
    )
    assert not drain.draining
    assert isinstance(answer, PeerError) and answer.message_id == "m1" and answer.error == "forbidden"


# --- the worker's shutdown order


class FakeJobs(NoJobs):
    """A job path that records the shutdown's calls; running jobs end when `finish` is called."""

    def __init__(self, *, held: list[str] | None = None, running: int = 0) -> None:
        self.held = list(held or [])
        self.running = running
        self.calls: list[tuple[str, Any]] = []
        self.flush_blocks = False
        self.gave_back_all = asyncio.Event()
        self.flushing = asyncio.Event()

    def held_jobs_not_started(self) -> list[str]:
        return list(self.held)

    async def give_back(self, job_id: str, detail: str) -> None:
        self.calls.append(("give_back", (job_id, detail)))
        if sum(1 for name, _ in self.calls if name == "give_back") == len(self.held):
            self.gave_back_all.set()

    def running_jobs_count(self) -> int:
        return self.running

    async def cancel_running(self, reason: str) -> None:
        self.calls.append(("cancel_running", reason))
        self.running = 0

    async def flush_outbox(self, timeout_s: float) -> None:
        self.calls.append(("flush_outbox", timeout_s))
        self.flushing.set()
        if self.flush_blocks:
            await asyncio.Event().wait()


async def test_with_nothing_running_the_shutdown_drains_and_flushes() -> None:
    jobs = FakeJobs()
    drain = NodeDrain(jobs=jobs)
    steps = await WorkerShutdown(drain, drain_timeout_ms=300_000).run()
    assert steps == ["drained", "gave_back", "waited", "flushed"]
    assert drain.draining and jobs.calls == [("flush_outbox", 10.0)]


async def test_held_jobs_are_given_back_and_running_ones_awaited_before_the_flush() -> None:
    jobs = FakeJobs(held=["j1", "j2"], running=1)
    shutdown = WorkerShutdown(NodeDrain(jobs=jobs), drain_timeout_ms=60_000, poll_s=0.01)
    task = asyncio.create_task(shutdown.run())
    await asyncio.wait_for(jobs.gave_back_all.wait(), timeout=5)
    assert not task.done()  # a job still runs
    jobs.running = 0
    steps = await task
    assert steps == ["drained", "gave_back", "waited", "flushed"]
    assert jobs.calls == [
        ("give_back", ("j1", "worker shutting down")),
        ("give_back", ("j2", "worker shutting down")),
        ("flush_outbox", 10.0),
    ]


async def test_jobs_still_running_at_the_drain_timeout_are_cancelled_as_worker_shutdown() -> None:
    now = [0.0]
    jobs = FakeJobs(running=2)

    def clock() -> float:
        now[0] += 1.0  # every look at the clock is a second later
        return now[0]

    steps = await WorkerShutdown(NodeDrain(jobs=jobs), drain_timeout_ms=3_000, poll_s=0, clock=clock).run()
    assert steps == ["drained", "gave_back", "cancelled", "flushed"]
    assert jobs.calls == [("cancel_running", "worker_shutdown"), ("flush_outbox", 10.0)]


async def test_a_second_signal_ends_the_wait_at_once_and_skips_cancel_and_flush() -> None:
    jobs = FakeJobs(running=1)
    drain = NodeDrain(jobs=jobs)
    shutdown = WorkerShutdown(drain, drain_timeout_ms=300_000, poll_s=60)
    parts = Parts()
    parts.put(DRAIN, drain)
    parts.put(WORKER_SHUTDOWN, shutdown)
    task = asyncio.create_task(shutdown.run())
    await asyncio.sleep(0)
    on_shutdown_signal(parts, first=False)
    steps = await asyncio.wait_for(task, timeout=5)
    assert steps == ["drained", "gave_back", "forced"] and jobs.calls == []


async def test_a_second_signal_abandons_a_flush_that_hangs() -> None:
    jobs = FakeJobs()
    jobs.flush_blocks = True
    shutdown = WorkerShutdown(NodeDrain(jobs=jobs), drain_timeout_ms=0)
    task = asyncio.create_task(shutdown.run())
    await asyncio.wait_for(jobs.flushing.wait(), timeout=5)
    shutdown.force()
    assert (await asyncio.wait_for(task, timeout=5))[-1] == "forced"


def test_the_first_signal_drains_the_node() -> None:
    drain, parts = NodeDrain(), Parts()
    on_shutdown_signal(parts, first=True)  # a node still starting: nothing to drain, no error
    parts.put(DRAIN, drain)
    on_shutdown_signal(parts, first=True)
    assert drain.draining
