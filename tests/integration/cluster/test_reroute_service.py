"""The coordinator's side of rerouting against a real database (both dialects), with a scripted worker."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import select

from conveyor.cluster.messages import JobProgress, JobRerouteAck
from conveyor.cluster.reroute import (
    CapacityUnit,
    RerouteService,
    RerouteSettings,
    WorkerLink,
    WorkerView,
)
from conveyor.db.engine import Database
from conveyor.db.tables import dispatch_queue, jobs, steps
from conveyor.execution.queue import AgentSlot, claim_for
from conveyor.execution.sweeps import SweepSettings, heartbeat_check
from conveyor.model import protocol as p
from conveyor.model.ids import format_rfc3339, new_id, utc_now
from tests.support.queued import queue_job
from tests.support.waiting import async_wait_until


class Session:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    async def send(self, message: Any) -> None:
        self.sent.append(message.wire())


class Peers:
    def __init__(self, *workers: str) -> None:
        self.sessions = {worker: Session() for worker in workers}

    def session_for(self, instance_id: str) -> Session | None:
        return self.sessions.get(instance_id)


class Dispatcher:
    def __init__(self) -> None:
        self.agents: dict[str, Any] = {}
        self.woken = 0

    def wake(self) -> None:
        self.woken += 1


def reroute_service(db: Database, peers: Peers, ack_timeout_ms: int = 15_000) -> RerouteService:
    async def settings(_org: str) -> RerouteSettings:
        return RerouteSettings(ack_timeout_ms=ack_timeout_ms, spawn_window_ms=60_000)

    return RerouteService(
        db,
        Dispatcher(),  # type: ignore[arg-type]
        peers,
        owner=lambda: "c1",
        settings=settings,
        max_attempts=5,
    )


async def offered(db: Database, service: RerouteService, worker: str = "w1") -> tuple[str, str]:
    """A queued job claimed for `worker` and offered to it; (job id, offer message id)."""
    job_id = await queue_job(db, "linux")
    service.worker_seen(WorkerView(worker, True, False, (), ()))
    link = WorkerLink(service, worker, CapacityUnit(f"{worker}/scaler/local/0", ("linux",), (), 1), rank=0)
    async with db.transaction() as conn:
        claim = await claim_for(
            conn, AgentSlot(link.agent_id, ("linux",), ()), owner="c1", now=utc_now(), ack_timeout_ms=10_000
        )
    assert claim is not None and claim.job_id == job_id
    dispatch = p.JobDispatch(
        id=new_id(),
        job_id=job_id,
        run_id=claim.run_id,
        attempt=claim.attempt,
        repo=p.RepoSpec(clone_url="file:///repo", sha="abc"),
        workflow=p.WorkflowSpec(name="ci", file="ci.py", content_hash="h", hashed_files=[]),
        job={"name": "build", "runs_on": {"labels": [], "exclude": []}},
        secrets={"KEY": "v"},
    )
    assert await link.offer(dispatch)
    return job_id, dispatch.id


async def accepted(db: Database, service: RerouteService, worker: str = "w1") -> str:
    job_id, message_id = await offered(db, service, worker)
    await service.on_ack(worker, JobRerouteAck(message_id=message_id, job_id=job_id, accepted=True))
    return job_id


async def job_row(db: Database, job_id: str) -> Any:
    async with db.read() as conn:
        return (await conn.execute(select(jobs).where(jobs.c.id == job_id))).one()


async def queue_state(db: Database, job_id: str) -> str | None:
    async with db.read() as conn:
        return (
            await conn.execute(select(dispatch_queue.c.state).where(dispatch_queue.c.job_id == job_id))
        ).scalar_one_or_none()


def progress(job_id: str, state: str, kind: str = "job", **fields: Any) -> JobProgress:
    return JobProgress(
        job_id=job_id, run_id="r", kind=kind, state=state, at=format_rfc3339(utc_now()), **fields
    )  # type: ignore[arg-type]


FINAL_STEPS = [{"step_index": 1, "name": "build", "kind": "step", "status": "success", "exit_code": 0}]


async def test_an_accepted_offer_records_the_holder_and_its_spawn_window(database: Database) -> None:
    peers = Peers("w1")
    service = reroute_service(database, peers)
    job_id = await accepted(database, service)
    row = await job_row(database, job_id)
    assert row.rerouted_to == "w1" and row.reroute_hop == 1 and row.reroute_tried == ["c1"]
    assert row.reroute_spawn_failures == 0 and row.reroute_window_expires_at is not None
    (offer,) = peers.sessions["w1"].sent
    assert offer["type"] == "job.reroute" and offer["secrets"] == {"KEY": "v"}


async def test_terminal_progress_from_the_holder_is_applied_once_and_acked_after_commit(
    database: Database,
) -> None:
    peers = Peers("w1")
    service = reroute_service(database, peers)
    job_id = await accepted(database, service)
    await service.on_progress("w1", progress(job_id, "running", data={"agent_id": "agent-7"}))
    assert (await job_row(database, job_id)).reroute_window_expires_at is None  # disarmed
    await service.on_progress("w1", progress(job_id, "success", final_steps=FINAL_STEPS))
    done = await job_row(database, job_id)
    assert done.status == "success" and done.agent_id == "agent-7"
    async with database.read() as conn:
        (step,) = list(await conn.execute(select(steps).where(steps.c.job_id == job_id)))
    assert step.status == "success" and step.exit_code == 0

    await service.on_progress("w1", progress(job_id, "success", final_steps=FINAL_STEPS))  # outbox replay
    again = await job_row(database, job_id)
    assert again.finished_at == done.finished_at
    acks = [m for m in peers.sessions["w1"].sent if m["type"] == "job.progress.ack"]
    assert [a["job_id"] for a in acks] == [job_id, job_id]


async def test_a_superseded_workers_result_is_acked_and_changes_nothing(database: Database) -> None:
    peers = Peers("w1", "w2")
    service = reroute_service(database, peers)
    job_id = await accepted(database, service, "w1")
    await service.on_progress("w2", progress(job_id, "failed"))
    row = await job_row(database, job_id)
    assert row.status == "dispatched" and row.rerouted_to == "w1"
    assert [m["type"] for m in peers.sessions["w2"].sent] == ["job.progress.ack"]


async def test_a_nak_puts_the_row_back_to_pending_and_the_worker_backs_off(database: Database) -> None:
    peers = Peers("w1")
    service = reroute_service(database, peers)
    job_id, message_id = await offered(database, service)
    await service.on_ack(
        "w1", JobRerouteAck(message_id=message_id, job_id=job_id, accepted=False, reason="no-capacity")
    )
    assert await queue_state(database, job_id) == "pending"
    row = await job_row(database, job_id)
    assert row.status == "queued" and row.rerouted_to is None
    assert not service.offerable("w1")


async def test_an_ack_from_another_worker_is_ignored(database: Database) -> None:
    peers = Peers("w1", "w2")
    service = reroute_service(database, peers)
    job_id, message_id = await offered(database, service, "w1")
    await service.on_ack("w2", JobRerouteAck(message_id=message_id, job_id=job_id, accepted=True))
    assert (await job_row(database, job_id)).rerouted_to is None
    assert service.pending  # still waiting for w1


async def test_no_answer_in_time_gives_the_row_back_and_cancels_on_the_worker(database: Database) -> None:
    peers = Peers("w1")
    service = reroute_service(database, peers, ack_timeout_ms=50)
    job_id, _ = await offered(database, service)
    await async_wait_until(
        lambda: _pending(database, job_id), timeout=10, what="the row to go back to pending"
    )
    sent = peers.sessions["w1"].sent
    await async_wait_until(
        lambda: _true(any(m["type"] == "job.cancel" for m in sent)), timeout=10, what="job.cancel"
    )
    assert not service.offerable("w1")


async def _pending(db: Database, job_id: str) -> bool:
    return await queue_state(db, job_id) == "pending"


async def _true(value: bool) -> bool:
    return value


async def _zero() -> int:
    return 0


async def test_the_sweep_leaves_a_rerouted_job_alone_within_the_flap_grace_only(database: Database) -> None:
    service = reroute_service(database, Peers("w1"))
    job_id = await accepted(database, service)
    await service.on_progress("w1", progress(job_id, "running"))
    long_ago = utc_now() + timedelta(hours=1)  # far past any dead-after
    live = {"w1": True}

    async def deferred(worker: str) -> bool:
        return live[worker]

    settings = SweepSettings(unroutable_grace_ms=_zero, dead_after_ms=1000, rerouted_job_deferred=deferred)
    async with database.transaction() as conn:
        await heartbeat_check(conn, settings, long_ago)
    assert (await job_row(database, job_id)).status == "running"

    live["w1"] = False
    async with database.transaction() as conn:
        await heartbeat_check(conn, settings, long_ago)
    row = await job_row(database, job_id)
    assert row.status == "timed_out" and row.reason == "stale" and row.rerouted_to is None


async def test_an_offer_the_worker_could_not_read_is_a_nak_invalid(database: Database) -> None:
    from conveyor.cluster.messages import PeerError

    peers = Peers("w1")
    service = reroute_service(database, peers)
    job_id, message_id = await offered(database, service)
    assert await service.handle("w1", PeerError(message_id=message_id, error="invalid", detail="labels: bad"))
    assert await queue_state(database, job_id) == "pending"
    assert service.metrics.offers.labels("invalid")._value.get() == 1


async def test_cancelling_a_rerouted_job_tells_its_worker_once_and_again_when_forced(
    database: Database,
) -> None:
    from conveyor.execution.lifecycle import CancelOutcome, cancel_job

    peers = Peers("w1")
    service = reroute_service(database, peers)
    job_id = await accepted(database, service)
    for force in (False, False, True):
        async with database.transaction() as conn:
            await cancel_job(
                conn, job_id, reason="cancelled_by", force=force, grace_ms=60_000, outcome=CancelOutcome()
            )
        await service.send_cancels()
    cancels = [m for m in peers.sessions["w1"].sent if m["type"] == "job.cancel"]
    assert [(c["job_id"], c["force"]) for c in cancels] == [(job_id, False), (job_id, True)]
    assert cancels[0]["reason"] == "cancelled_by"

    await service.on_progress("w1", progress(job_id, "cancelled"))
    assert (await job_row(database, job_id)).status == "cancelled"
