"""The coordinator's side of rerouting against a real database (both dialects), with a scripted worker."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select, update
from sqlalchemy.exc import DBAPIError

from conveyor.cluster.messages import (
    JobCancelRelay,
    JobProgress,
    JobRerouteAck,
    LogChunkRelay,
)
from conveyor.cluster.reroute import (
    CapacityUnit,
    RerouteService,
    RerouteSettings,
    WorkerLink,
    WorkerView,
    resolve_reroute_settings,
)
from conveyor.db.engine import Database, is_transient
from conveyor.db.tables import DEFAULT_ORG, dispatch_history, dispatch_queue, jobs, steps
from conveyor.execution import log_store
from conveyor.execution.queue import AgentSlot, claim_for
from conveyor.execution.sweeps import SweepSettings, heartbeat_check
from conveyor.model import protocol as p
from conveyor.model.ids import format_rfc3339, new_id, utc_now
from tests.support.queued import queue_job
from tests.support.reroute import (
    KNOBS,
    STARTED,
    Dispatcher,
    Peers,
    give_back,
    job_dispatch,
    job_row,
    nak,
    offered_through,
    offers,
    reroute_service,
    seen,
)
from tests.support.waiting import async_wait_until


@pytest.fixture(autouse=True)
async def stop_services(database: Database) -> AsyncIterator[None]:
    """Every service a test made stops its ack and spawn-window timers before its database closes."""
    yield
    while STARTED:
        await STARTED.pop().stop()


async def offered(
    db: Database,
    service: RerouteService,
    worker: str = "w1",
    org: str = DEFAULT_ORG,
    secrets: dict[str, str] | None = None,
    job_id: str | None = None,
) -> tuple[str, str]:
    """A queued job of `org` (a new one, else `job_id` back in the queue) claimed for `worker` and offered to
    it; (job id, offer message id)."""
    job_id = job_id or await queue_job(db, "linux")
    if org != DEFAULT_ORG:
        async with db.transaction() as conn:
            await conn.execute(update(jobs).where(jobs.c.id == job_id).values(org_id=org))
            await conn.execute(
                update(dispatch_queue).where(dispatch_queue.c.job_id == job_id).values(org_id=org)
            )
    service.worker_seen(WorkerView(worker, True, False, (), ()))
    link = WorkerLink(service, worker, CapacityUnit(f"{worker}/scaler/local/0", ("linux",), (), 1), rank=0)
    async with db.transaction() as conn:
        claim = await claim_for(
            conn, AgentSlot(link.agent_id, ("linux",), ()), owner="c1", now=utc_now(), ack_timeout_ms=10_000
        )
    assert claim is not None and claim.job_id == job_id
    dispatch = job_dispatch(
        claim, secrets if secrets is not None else {"KEY": "v"}, runs_on={"labels": [], "exclude": []}
    )
    assert await link.offer(dispatch)
    return job_id, dispatch.id


async def accepted(
    db: Database,
    service: RerouteService,
    worker: str = "w1",
    secrets: dict[str, str] | None = None,
    *,
    job_id: str | None = None,
    duplicate: bool = False,
) -> str:
    job_id, message_id = await offered(db, service, worker, secrets=secrets, job_id=job_id)
    await service.on_ack(
        worker, JobRerouteAck(message_id=message_id, job_id=job_id, accepted=True, duplicate=duplicate)
    )
    return job_id


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


async def test_an_offer_carries_the_spawn_budget_of_the_jobs_own_org(database: Database) -> None:
    # Org override > cluster value (docs/design/cluster.md §4.2, §6), for the org the job's row names: the
    # first offer resolves the same org's knobs as every later one (the dispatch itself names no org).
    peers = Peers("w1")
    acme = {"reroute_spawn_max_attempts": 1, "reroute_spawn_retry_backoff_ms": 0}
    service = reroute_service(database, peers, org_overrides={"acme": acme})
    job_id, message_id = await offered(database, service, org="acme")
    (offer,) = peers.sessions["w1"].sent
    assert offer["org_id"] == "acme"
    assert offer["spawn_retry"] == {"max_attempts": 1, "backoff_ms": 0}
    await service.on_ack("w1", JobRerouteAck(message_id=message_id, job_id=job_id, accepted=True))
    row = await job_row(database, job_id)
    assert (row.reroute_spawn_max_attempts, row.reroute_spawn_retry_backoff_ms) == (1, 0)

    # A job of an org without overrides keeps the cluster's values.
    plain_peers = Peers("w1")
    await offered(database, reroute_service(database, plain_peers))
    (plain,) = plain_peers.sessions["w1"].sent
    assert plain["org_id"] == DEFAULT_ORG
    assert plain["spawn_retry"] == {"max_attempts": 2, "backoff_ms": 700}


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


async def test_outputs_errors_and_emits_a_worker_relays_are_masked_again_before_they_are_stored(
    database: Database,
) -> None:
    from conveyor.cluster.messages import EventEmitRelay

    offered_secret, read_again = "offered-secret-value", "read-again-secret"
    peers = Peers("w1")
    service = reroute_service(database, peers)
    job_id = await accepted(database, service, secrets={"KEY": offered_secret})
    emitted: list[p.EventEmit] = []

    async def emitter(_agent_id: str, message: p.EventEmit) -> p.EventEmitResult:
        emitted.append(message)
        return p.EventEmitResult(request_id=message.request_id, event_id="ev-1", created=True)

    service.event_emitter = lambda: emitter
    step = {"name": "first", "outputs": {offered_secret: [offered_secret]}, "error": f"e {offered_secret}"}
    await service.on_progress("w1", progress(job_id, "failed", kind="step", step_index=1, data=step))
    await service.on_event_emit(
        "w1", EventEmitRelay(job_id=job_id, request_id="r1", name="x", payload={"v": offered_secret})
    )
    # A coordinator started since (nothing in memory) reads the job's values again.
    await service.stop()
    resolved: list[str] = []

    async def secret_values(_conn: Any, asked: str) -> list[str]:
        resolved.append(asked)
        return [read_again]

    again = RerouteService(
        database,
        Dispatcher(),  # type: ignore[arg-type]
        peers,
        owner=lambda: "c1",
        settings=lambda org: resolve_reroute_settings(org, lambda _org, name: _knob(name)),
        max_attempts=5,
        secret_values=secret_values,
    )
    STARTED.append(again)
    final = [{"step_index": 2, "name": "second", "status": "success", "outputs": {"k": read_again}}]
    await again.on_progress(
        "w1", progress(job_id, "success", final_steps=final, data={"outputs": {"second": {"k": read_again}}})
    )
    assert resolved == [job_id]
    async with database.read() as conn:
        rows = {r.name: r for r in await conn.execute(select(steps).where(steps.c.job_id == job_id))}
    assert rows["first"].outputs == {"***": ["***"]} and rows["first"].error == "e ***"
    assert rows["second"].outputs == {"k": "***"}
    assert (await job_row(database, job_id)).outputs == {"second": {"k": "***"}}
    assert [m.payload for m in emitted] == [{"v": "***"}]


async def _knob(name: str) -> int:
    return KNOBS[name]


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
    service = reroute_service(database, peers, reroute_ack_timeout_ms=50)
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


async def test_a_not_started_job_of_a_silent_worker_goes_back_with_the_flap_grace_as_its_reason(
    database: Database,
) -> None:
    service = reroute_service(database, Peers("w1"))
    job_id = await accepted(database, service)

    async def silent(_worker: str) -> bool:
        return False

    settings = SweepSettings(unroutable_grace_ms=_zero, dead_after_ms=1000, rerouted_job_deferred=silent)
    async with database.transaction() as conn:
        await heartbeat_check(conn, settings, utc_now() + timedelta(hours=1))
    assert await queue_state(database, job_id) == "pending"
    async with database.read() as conn:
        (history,) = list(
            await conn.execute(select(dispatch_history).where(dispatch_history.c.job_id == job_id))
        )
    assert (history.agent_id, history.outcome) == ("worker:w1", "agent_lost")
    assert (history.reason, history.reroute_hop) == ("flap-grace", 1)


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


async def test_a_job_cancelled_while_its_offer_waited_for_the_ack_is_cancelled_on_the_worker_that_takes_it(
    database: Database,
) -> None:
    # Found by the chaos harness: the accepting ack found the job `cancelling`, no holder was recorded yet
    # the worker was let run it; its progress then counted as a stranger's, it was told to drop the job,
    # and the job stayed `cancelling` until the 5-minute cancel deadline.
    from conveyor.execution.lifecycle import CancelOutcome, cancel_job

    peers = Peers("w1")
    service = reroute_service(database, peers)
    job_id, message_id = await offered(database, service)
    async with database.transaction() as conn:
        await cancel_job(
            conn, job_id, reason="cancelled_by", force=False, grace_ms=60_000, outcome=CancelOutcome()
        )
    await service.on_ack("w1", JobRerouteAck(message_id=message_id, job_id=job_id, accepted=True))
    assert (await job_row(database, job_id)).rerouted_to == "w1"
    await service.send_cancels()
    cancels = [m for m in peers.sessions["w1"].sent if m["type"] == "job.cancel"]
    assert [(c["job_id"], c["reason"]) for c in cancels] == [(job_id, "cancelled_by")]

    await service.on_progress("w1", progress(job_id, "cancelled"))
    assert (await job_row(database, job_id)).status == "cancelled"


# --- hops and tried (docs/design/cluster.md §4.1, §4.2)


async def claimed_by(db: Database, job_id: str) -> tuple[str | None, str | None]:
    async with db.read() as conn:
        row = (
            await conn.execute(
                select(dispatch_queue.c.state, dispatch_queue.c.agent_id).where(
                    dispatch_queue.c.job_id == job_id
                )
            )
        ).one()
    return row.state, row.agent_id


async def test_the_first_offer_goes_to_the_worker_with_the_most_free_matching_slots(
    database: Database,
) -> None:
    peers = Peers("w1", "w2")
    service = reroute_service(database, peers)
    seen(service, "w1", slots=1)
    seen(service, "w2", slots=3)
    job_id = await offered_through(database, service, "w1")
    assert offers(peers, "w1") == []
    (offer,) = offers(peers, "w2")
    assert (offer["job_id"], offer["hop"], offer["tried"]) == (job_id, 1, ["c1"])
    assert await claimed_by(database, job_id) == ("claimed", "worker:w2")
    assert (await job_row(database, job_id)).agent_id == "worker:w2"


async def test_a_first_offer_moved_to_a_worker_whose_session_ended_goes_back_to_pending(
    database: Database,
) -> None:
    peers = Peers("w1")  # w2's heartbeat is known, its session is gone
    service = reroute_service(database, peers)
    seen(service, "w1", slots=1)
    seen(service, "w2", slots=3)
    job_id = await offered_through(database, service, "w1")
    assert offers(peers, "w1") == []
    assert await claimed_by(database, job_id) == ("pending", None)
    assert (await job_row(database, job_id)).reroute_tried is None  # any worker may claim it again


async def test_a_nak_offers_the_same_job_to_the_next_worker_with_the_next_hop(database: Database) -> None:
    peers = Peers("w1", "w2")
    service = reroute_service(database, peers)
    seen(service, "w1", slots=2)
    seen(service, "w2", slots=1)
    job_id = await offered_through(database, service, "w1")
    await nak(service, peers, "w1")
    (offer,) = offers(peers, "w2")
    assert (offer["job_id"], offer["hop"], offer["max_hops"], offer["tried"]) == (job_id, 2, 3, ["c1", "w1"])
    assert offer["coordinator_id"] == "c1" and offer["secrets"] == {"KEY": "v"}
    assert offer["message_id"] != offers(peers, "w1")[0]["message_id"]
    assert await claimed_by(database, job_id) == ("claimed", "worker:w2")
    async with database.read() as conn:
        (history,) = list(
            await conn.execute(select(dispatch_history).where(dispatch_history.c.job_id == job_id))
        )
    assert (history.agent_id, history.outcome, history.detail) == (
        "worker:w1",
        "rejected",
        "worker w1: no-capacity",
    )
    assert (history.reason, history.reroute_hop) == ("no-capacity", 1)  # what `run show` names
    assert not service.offerable("w1")  # it backs off for other jobs too


async def test_a_nak_reason_longer_than_the_history_column_is_cut_to_fit(database: Database) -> None:
    peers = Peers("w1", "w2")
    service = reroute_service(database, peers)
    seen(service, "w1", slots=2)
    seen(service, "w2", slots=1)
    job_id = await offered_through(database, service, "w1")
    await nak(service, peers, "w1", reason="x" * 200)
    assert len(offers(peers, "w2")) == 1
    async with database.read() as conn:
        (history,) = list(
            await conn.execute(select(dispatch_history).where(dispatch_history.c.job_id == job_id))
        )
    assert history.reason == "x" * 32 and history.detail == "worker w1: " + "x" * 200


async def test_an_ack_timeout_cancels_on_that_worker_and_offers_the_job_onwards(database: Database) -> None:
    peers = Peers("w1", "w2")
    service = reroute_service(database, peers, reroute_ack_timeout_ms=50)
    seen(service, "w1", slots=2)
    seen(service, "w2", slots=1)
    job_id = await offered_through(database, service, "w1")
    await async_wait_until(lambda: _true(bool(offers(peers, "w2"))), timeout=10, what="the offer to w2")
    cancels = [m for m in peers.sessions["w1"].sent if m["type"] == "job.cancel"]
    assert [(c["job_id"], c["reason"], c["force"]) for c in cancels] == [(job_id, "ack-timeout", True)]
    assert (offers(peers, "w2")[0]["hop"], offers(peers, "w2")[0]["tried"]) == (2, ["c1", "w1"])
    assert service.metrics.offers.labels("ack-timeout")._value.get() == 1
    assert service.metrics.redispatches.labels("ack-timeout")._value.get() == 1
    async with database.read() as conn:
        (history,) = list(
            await conn.execute(select(dispatch_history).where(dispatch_history.c.job_id == job_id))
        )
    assert (history.outcome, history.reason, history.reroute_hop) == ("ack_timeout", "ack-timeout", 1)


async def test_an_acceptance_arriving_after_the_ack_timeout_is_told_to_drop_the_job(
    database: Database,
) -> None:
    # Found by the chaos harness (chaos/replay.py): the ack reached the coordinator after its timeout had sent
    # the job onwards, and the late worker ran it too.
    peers = Peers("w1", "w2")
    service = reroute_service(database, peers, reroute_ack_timeout_ms=50)
    seen(service, "w1", slots=2)
    seen(service, "w2", slots=1)
    # w2 accepts the offer onwards as it reads it. Its answer is scheduled before the offer's 50 ms timer is
    # (the timer starts after `send` returns), and `on_ack` stops that timer before its first await: an answer
    # the test sent after polling for the offer could come after the timeout on a loaded machine.
    answers: list[asyncio.Task[None]] = []

    def accept(message: dict[str, Any]) -> None:
        if message["type"] == "job.reroute":
            ack = JobRerouteAck(message_id=message["message_id"], job_id=message["job_id"], accepted=True)
            answers.append(asyncio.get_running_loop().create_task(service.on_ack("w2", ack)))

    peers.sessions["w2"].answer = accept
    job_id = await offered_through(database, service, "w1")
    await async_wait_until(lambda: _true(bool(answers)), timeout=10, what="the offer to w2")
    await answers[0]
    onwards = offers(peers, "w2")[0]["message_id"]
    late = offers(peers, "w1")[0]["message_id"]
    await service.on_ack("w1", JobRerouteAck(message_id=late, job_id=job_id, accepted=True))
    cancels = [
        (m["job_id"], m["reason"], m["force"]) for m in peers.sessions["w1"].sent if m["type"] == "job.cancel"
    ]
    assert cancels == [(job_id, "ack-timeout", True), (job_id, "rerouted", True)]
    assert (await job_row(database, job_id)).rerouted_to == "w2"
    assert not [m for m in peers.sessions["w2"].sent if m["type"] == "job.cancel"]
    # A late duplicate from the holder itself is no reason to cancel.
    await service.on_ack(
        "w2", JobRerouteAck(message_id=onwards, job_id=job_id, accepted=True, duplicate=True)
    )
    assert not [m for m in peers.sessions["w2"].sent if m["type"] == "job.cancel"]


async def test_an_ack_read_in_time_stops_the_offers_timer_while_it_waits_behind_slower_messages(
    database: Database,
) -> None:
    # Found by the chaos harness: the ack waited in the session's inbox behind a result whose transaction
    # waited on a run's lock, the timer fired, and the job went to a second worker.
    peers = Peers("w1", "w2")
    service = reroute_service(database, peers, reroute_ack_timeout_ms=300)
    seen(service, "w1", slots=2)
    seen(service, "w2", slots=1)
    job_id = await offered_through(database, service, "w1")
    (offer,) = service.pending.values()
    timer = offer.timer
    assert timer is not None
    ack = JobRerouteAck(message_id=offers(peers, "w1")[0]["message_id"], job_id=job_id, accepted=True)
    service.ack_arrived("w2", ack)  # the right offer, the wrong sender: stops nothing
    assert not timer.done()
    service.ack_arrived("w1", ack)
    await asyncio.gather(timer, return_exceptions=True)
    assert timer.cancelled()
    assert service.pending and not offers(peers, "w2")
    assert not [m for m in peers.sessions["w1"].sent if m["type"] == "job.cancel"]
    await service.on_ack("w1", ack)  # its turn in the inbox comes
    assert (await job_row(database, job_id)).rerouted_to == "w1"


async def test_a_first_offer_gives_its_row_the_reroute_ack_deadline_not_the_agents_shorter_one(
    database: Database,
) -> None:
    # Found by the chaos harness: the row kept the dispatcher's claim deadline (dispatch_ack_timeout_ms, 10 s),
    # so the ack sweep took it back while the worker could still accept within reroute_ack_timeout_ms (15 s);
    # the late ack then found the job gone, and the worker had already started it.
    peers = Peers("w1")
    service = reroute_service(database, peers, reroute_ack_timeout_ms=15_000)
    before = utc_now()
    job_id, _ = await offered(database, service)  # claimed with a 10 s ack deadline, offered to w1
    async with database.read() as conn:
        deadline = (
            await conn.execute(select(dispatch_queue.c.ack_deadline).where(dispatch_queue.c.job_id == job_id))
        ).scalar_one()
    assert deadline >= before + timedelta(seconds=15)


async def test_an_ack_whose_transaction_the_database_ended_is_applied_by_its_retry(
    database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found by the chaos harness: pg_terminate_backend ended the ack's transaction, the ack was dropped, the
    # row went back to the queue and another agent ran the job the worker was running.
    from conveyor.cluster import store

    peers = Peers("w1")
    service = reroute_service(database, peers)
    job_id, message_id = await offered(database, service)
    real = store.mark_rerouted
    calls = 0

    async def ended_once(*args: Any, **kwargs: Any) -> bool:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise DBAPIError(
                "UPDATE", {}, Exception("server closed the connection"), connection_invalidated=True
            )
        return await real(*args, **kwargs)

    monkeypatch.setattr(store, "mark_rerouted", ended_once)
    ack = JobRerouteAck(message_id=message_id, job_id=job_id, accepted=True)
    with pytest.raises(DBAPIError) as raised:
        await service.on_ack("w1", ack)
    assert is_transient(raised.value) and service.pending  # the offer waits for the retry
    await service.on_ack("w1", ack)  # the peer hub's retry
    assert (await job_row(database, job_id)).rerouted_to == "w1" and not service.pending
    assert not [m for m in peers.sessions["w1"].sent if m["type"] == "job.cancel"]


async def test_progress_from_a_worker_that_does_not_hold_the_job_stops_it_there(database: Database) -> None:
    peers = Peers("w1", "w2")
    service = reroute_service(database, peers)
    job_id = await accepted(database, service, "w1")
    await service.on_progress("w2", progress(job_id, "running", data={"agent_id": "agent-9"}))
    row = await job_row(database, job_id)
    assert row.status == "dispatched" and row.rerouted_to == "w1"
    sent = [(m["type"], m.get("job_id"), m.get("reason"), m.get("force")) for m in peers.sessions["w2"].sent]
    assert sent == [("job.cancel", job_id, "rerouted", True)]
    assert not [m for m in peers.sessions["w1"].sent if m["type"] == "job.cancel"]


async def test_an_ack_after_a_hop_records_the_hop_the_workers_tried_and_the_spawn_budget(
    database: Database,
) -> None:
    peers = Peers("w1", "w2")
    service = reroute_service(database, peers)
    seen(service, "w1", slots=2)
    seen(service, "w2", slots=1)
    job_id = await offered_through(database, service, "w1")
    await nak(service, peers, "w1")
    (offer,) = offers(peers, "w2")
    before = utc_now()
    await service.on_ack("w2", JobRerouteAck(message_id=offer["message_id"], job_id=job_id, accepted=True))
    row = await job_row(database, job_id)
    assert (row.rerouted_to, row.reroute_hop, row.reroute_tried) == ("w2", 2, ["c1", "w1"])
    assert (
        row.reroute_spawn_max_attempts,
        row.reroute_spawn_retry_backoff_ms,
        row.reroute_spawn_failures,
    ) == (
        2,
        700,
        0,
    )
    window = row.reroute_window_expires_at - before
    assert timedelta(seconds=59) <= window <= timedelta(seconds=61)


async def test_when_hops_run_out_the_row_goes_back_for_local_capacity_only(database: Database) -> None:
    peers = Peers("w1", "w2", "w3")
    service = reroute_service(database, peers, reroute_max_hops=2)
    seen(service, "w1", slots=3)
    seen(service, "w2", slots=2)
    seen(service, "w3", slots=1)
    job_id = await offered_through(database, service, "w1")
    await nak(service, peers, "w1")
    await nak(service, peers, "w2")
    assert offers(peers, "w3") == []  # a third offer would be hop 3 > max_hops 2
    assert await queue_state(database, job_id) == "pending"
    row = await job_row(database, job_id)
    assert (row.status, row.rerouted_to, row.reroute_tried, row.reroute_hop) == (
        "queued",
        None,
        ["c1", "w1", "w2"],
        2,
    )
    async with database.read() as conn:
        last_error = (
            await conn.execute(select(dispatch_queue.c.last_error).where(dispatch_queue.c.job_id == job_id))
        ).scalar_one()
    assert "tried: w1, w2" in last_error

    async with database.transaction() as conn:
        worker_slot = AgentSlot("worker:w3", ("linux",), (), remote=True)
        assert await claim_for(conn, worker_slot, owner="c1", now=utc_now(), ack_timeout_ms=10_000) is None
        local = await claim_for(
            conn, AgentSlot("a1", ("linux",), ()), owner="c1", now=utc_now(), ack_timeout_ms=10_000
        )
    assert local is not None and local.job_id == job_id


async def test_when_no_candidate_is_left_the_row_goes_back_for_local_capacity_only(
    database: Database,
) -> None:
    peers = Peers("w1")
    service = reroute_service(database, peers)
    seen(service, "w1")
    job_id = await offered_through(database, service, "w1")
    await nak(service, peers, "w1", reason="draining")
    assert await queue_state(database, job_id) == "pending"
    assert (await job_row(database, job_id)).reroute_tried == ["c1", "w1"]


async def test_a_worker_whose_session_is_gone_is_skipped_for_the_next_candidate(database: Database) -> None:
    peers = Peers("w1", "w2", "w3")
    service = reroute_service(database, peers)
    seen(service, "w1", slots=3)
    seen(service, "w2", slots=2)
    seen(service, "w3", slots=1)
    job_id = await offered_through(database, service, "w1")
    del peers.sessions["w2"]
    await nak(service, peers, "w1")
    (offer,) = offers(peers, "w3")
    assert (offer["job_id"], offer["hop"], offer["tried"]) == (job_id, 3, ["c1", "w1", "w2"])


async def test_each_reroute_knob_resolves_org_column_then_cluster_column_then_default(
    database: Database,
) -> None:
    from conveyor.model.knobs import ALL_KNOBS
    from conveyor.runtime import store as settings_store
    from conveyor.runtime.settings import SettingsResolver

    async with database.transaction() as conn:
        now = await settings_store.database_now(conn)
        stored = await settings_store.lock_cluster_settings(conn)
        cluster = {"reroute_ack_timeout_ms": 4000, "reroute_max_hops": 5, "reroute_spawn_max_attempts": 4}
        await settings_store.write_cluster_settings(
            conn, {**stored.values, **cluster}, version=stored.version + 1, at=now, by="test"
        )
        org = await settings_store.lock_org_settings(conn, "acme")
        overrides = {"reroute_max_hops": 2, "reroute_spawn_retry_backoff_ms": 250}
        await settings_store.write_org_settings(
            conn, "acme", {**org.values, **overrides}, version=org.version + 1, at=now, by="test"
        )
    defaults = {knob.name: knob.default for knob in ALL_KNOBS} | {"reroute_spawn_window_ms": 7000}
    resolver = SettingsResolver(database, defaults, cache_ttl_ms=0)

    acme = await resolve_reroute_settings("acme", resolver.org_value)
    assert acme == RerouteSettings(
        ack_timeout_ms=4000,  # cluster column
        max_hops=2,  # org column beats the cluster's 5
        spawn_window_ms=7000,  # env default
        spawn_max_attempts=4,  # cluster column
        spawn_retry_backoff_ms=250,  # org column
    )
    other = await resolve_reroute_settings("other", resolver.org_value)
    assert (other.max_hops, other.spawn_retry_backoff_ms) == (5, 5000)


async def test_a_handed_back_job_fails_unroutable_naming_the_workers_tried_while_others_wait_for_a_worker(
    database: Database,
) -> None:
    from conveyor.execution.sweeps import classify_queue

    peers = Peers("w1")
    service = reroute_service(database, peers)
    seen(service, "w1")
    handed_back = await offered_through(database, service, "w1")
    await nak(service, peers, "w1", reason="no-capacity")
    fresh = await queue_job(database, "linux")
    settings = SweepSettings(unroutable_grace_ms=_zero, worker_note=service.wait_note)
    async with database.transaction() as conn:
        await classify_queue(conn, settings, utc_now())
    failed = await job_row(database, handed_back)
    assert failed.status == "failed"
    assert failed.reason == "unroutable: no connected agent or scaler matches [linux] (workers tried: w1)"
    waiting = await job_row(database, fresh)
    assert (waiting.status, waiting.reason) == ("queued", "waiting: worker w1 can run it when it has room")


# --- re-dispatch (docs/design/cluster.md §4.4)


async def held_by(db: Database, service: RerouteService, peers: Peers, worker: str) -> str:
    """A `linux` job offered to and accepted by `worker` (the best-ranked worker)."""
    job_id = await offered_through(db, service, worker)
    (offer,) = offers(peers, worker)
    await service.on_ack(worker, JobRerouteAck(message_id=offer["message_id"], job_id=job_id, accepted=True))
    assert (await job_row(db, job_id)).rerouted_to == worker
    return job_id


async def test_a_give_back_cancels_on_the_holder_and_offers_the_same_job_to_the_next_worker(
    database: Database,
) -> None:
    peers = Peers("w1", "w2")
    service = reroute_service(database, peers)
    seen(service, "w1", slots=2)
    seen(service, "w2", slots=1)
    job_id = await held_by(database, service, peers, "w1")
    await service.on_scaler_event("w1", give_back(job_id))
    cancels = [m for m in peers.sessions["w1"].sent if m["type"] == "job.cancel"]
    assert [(c["job_id"], c["reason"], c["force"]) for c in cancels] == [(job_id, "rerouted", True)]
    (offer,) = offers(peers, "w2")
    assert (offer["job_id"], offer["hop"], offer["tried"], offer["secrets"]) == (
        job_id,
        2,
        ["c1", "w1"],
        {"KEY": "v2"},
    )
    row = await job_row(database, job_id)
    assert (row.status, row.rerouted_to, row.reroute_window_expires_at) == ("dispatched", None, None)
    assert await claimed_by(database, job_id) == ("claimed", "worker:w2")
    async with database.read() as conn:
        (history,) = list(
            await conn.execute(select(dispatch_history).where(dispatch_history.c.job_id == job_id))
        )
    assert (history.agent_id, history.outcome) == ("worker:w1", "taken_back")
    assert history.detail == "worker w1: gave the job back: spawn failed"
    assert (history.reason, history.reroute_hop) == ("final", 1)
    assert service.metrics.redispatches.labels("final")._value.get() == 1


async def test_of_racing_redispatches_exactly_one_wins(database: Database) -> None:
    peers = Peers("w1", "w2")
    service = reroute_service(database, peers)
    seen(service, "w1", slots=2)
    seen(service, "w2", slots=1)
    job_id = await held_by(database, service, peers, "w1")
    results = await asyncio.gather(
        service.redispatch(job_id, "w1", "window", "spawn window lapsed"),
        service.redispatch(job_id, "w1", "final", "gave the job back"),
        service.redispatch(job_id, "w1", "window", "the leader's sweep"),
    )
    assert sorted(results) == [False, False, True]
    assert len(offers(peers, "w2")) == 1


async def test_a_give_back_from_a_worker_that_does_not_hold_the_job_changes_nothing(
    database: Database,
) -> None:
    peers = Peers("w1", "w2")
    service = reroute_service(database, peers)
    seen(service, "w1", slots=2)
    seen(service, "w2", slots=1)
    job_id = await held_by(database, service, peers, "w1")
    await service.on_scaler_event("w2", give_back(job_id))
    row = await job_row(database, job_id)
    assert row.rerouted_to == "w1" and row.reroute_window_expires_at is not None
    assert offers(peers, "w2") == [] and service.metrics.redispatches.labels("final")._value.get() == 0


async def test_a_started_job_is_never_taken_back(database: Database) -> None:
    peers = Peers("w1", "w2")
    service = reroute_service(database, peers)
    seen(service, "w1", slots=2)
    seen(service, "w2", slots=1)
    job_id = await held_by(database, service, peers, "w1")
    await service.on_progress("w1", progress(job_id, "running"))
    assert not await service.redispatch(job_id, "w1", "window", "spawn window lapsed")
    assert (await job_row(database, job_id)).status == "running"
    assert offers(peers, "w2") == []


async def test_a_give_back_with_no_worker_left_hands_the_row_back_to_local_capacity(
    database: Database,
) -> None:
    peers = Peers("w1")
    service = reroute_service(database, peers)
    seen(service, "w1")
    job_id = await held_by(database, service, peers, "w1")
    await service.on_scaler_event("w1", give_back(job_id))
    assert await queue_state(database, job_id) == "pending"
    row = await job_row(database, job_id)
    assert (row.status, row.rerouted_to, row.reroute_tried) == ("queued", None, ["c1", "w1"])


async def test_a_give_back_at_the_last_hop_hands_the_row_back_even_with_workers_left(
    database: Database,
) -> None:
    peers = Peers("w1", "w2")
    service = reroute_service(database, peers, reroute_max_hops=1)
    seen(service, "w1", slots=2)
    seen(service, "w2", slots=1)
    job_id = await held_by(database, service, peers, "w1")
    await service.on_scaler_event("w1", give_back(job_id))
    assert offers(peers, "w2") == []
    assert await queue_state(database, job_id) == "pending"


# --- the spawn window, Layer A (docs/design/cluster.md §4.3), and the leader's sweep
# (docs/design/cluster.md §4.4)


async def test_a_lapsed_spawn_window_cancels_on_the_holder_and_offers_the_job_onwards(
    database: Database,
) -> None:
    peers = Peers("w1", "w2")
    service = reroute_service(database, peers, reroute_spawn_window_ms=100)
    seen(service, "w1", slots=2)
    seen(service, "w2", slots=1)
    job_id = await held_by(database, service, peers, "w1")
    await async_wait_until(lambda: _true(bool(offers(peers, "w2"))), timeout=10, what="the offer to w2")
    cancels = [m for m in peers.sessions["w1"].sent if m["type"] == "job.cancel"]
    assert [(c["job_id"], c["reason"], c["force"]) for c in cancels] == [(job_id, "rerouted", True)]
    assert (offers(peers, "w2")[0]["hop"], offers(peers, "w2")[0]["tried"]) == (2, ["c1", "w1"])
    assert service.metrics.redispatches.labels("window")._value.get() == 1


async def test_the_first_progress_disarms_the_spawn_window(database: Database) -> None:
    peers = Peers("w1", "w2")
    service = reroute_service(database, peers)
    seen(service, "w1", slots=2)
    seen(service, "w2", slots=1)
    job_id = await held_by(database, service, peers, "w1")
    assert job_id in service.windows
    await service.on_progress("w1", progress(job_id, "running"))
    assert job_id not in service.windows
    assert not await service.window_lapsed(job_id, "w1")
    assert (await job_row(database, job_id)).status == "running" and offers(peers, "w2") == []


async def test_a_window_pushed_to_a_later_deadline_is_waited_for(database: Database) -> None:
    peers = Peers("w1", "w2")
    service = reroute_service(database, peers)
    seen(service, "w1", slots=2)
    seen(service, "w2", slots=1)
    job_id = await held_by(database, service, peers, "w1")
    service.disarm_window(job_id)
    async with database.transaction() as conn:
        await conn.execute(
            update(jobs)
            .where(jobs.c.id == job_id)
            .values(reroute_window_expires_at=utc_now() + timedelta(hours=1))
        )
    assert not await service.window_lapsed(job_id, "w1")
    assert job_id in service.windows  # re-armed for the new deadline
    assert (await job_row(database, job_id)).rerouted_to == "w1"


async def test_a_restarted_coordinator_rearms_the_windows_of_the_jobs_it_holds(database: Database) -> None:
    peers = Peers("w1")
    service = reroute_service(database, peers)
    seen(service, "w1")
    job_id = await held_by(database, service, peers, "w1")
    await service.stop()
    again = reroute_service(database, peers)
    other = reroute_service(database, peers, owner="c2")
    assert await again.rearm_windows() == 1 and job_id in again.windows
    assert await other.rearm_windows() == 0
    await again.stop()


async def beat(db: Database, instance_id: str) -> None:
    from conveyor.runtime import store as instance_store

    async with db.transaction() as conn:
        await instance_store.beat_instance(
            conn,
            instance_id=instance_id,
            boot_id=new_id(),
            role="coordinator",
            advertise_url=None,
            software_version="test",
            started_at=utc_now(),
            draining=False,
            applied_settings_version=0,
        )


async def lapsed_under_a_gone_owner(database: Database) -> str:
    """A job w1 holds for coordinator c1, whose spawn window has lapsed; c1 is gone, its timer with it."""
    owner_peers = Peers("w1", "w2")
    owner = reroute_service(database, owner_peers)
    seen(owner, "w1", slots=2)
    seen(owner, "w2", slots=1)
    job_id = await held_by(database, owner, owner_peers, "w1")
    owner.disarm_window(job_id)
    async with database.transaction() as conn:
        await conn.execute(
            update(jobs)
            .where(jobs.c.id == job_id)
            .values(reroute_window_expires_at=utc_now() - timedelta(seconds=1))
        )
    return job_id


async def test_the_leader_sweeps_lapsed_windows_only_of_coordinators_not_live(database: Database) -> None:
    job_id = await lapsed_under_a_gone_owner(database)
    leader_peers = Peers("w1", "w2")
    leader = reroute_service(database, leader_peers, owner="c2")
    seen(leader, "w1", slots=2)
    seen(leader, "w2", slots=1)

    await beat(database, "c1")
    assert await leader.sweep_lapsed_windows(timedelta(seconds=30)) == 0  # its owner's timer decides
    assert (await job_row(database, job_id)).rerouted_to == "w1"

    assert await leader.sweep_lapsed_windows(timedelta(0)) == 1  # c1's row is stale now
    cancels = [m for m in leader_peers.sessions["w1"].sent if m["type"] == "job.cancel"]
    assert [(c["job_id"], c["reason"]) for c in cancels] == [(job_id, "rerouted")]
    (offer,) = offers(leader_peers, "w2")
    assert (offer["job_id"], offer["hop"], offer["tried"]) == (job_id, 2, ["c1", "w1"])
    assert offer["coordinator_id"] == "c2"  # its progress goes to the live coordinator
    async with database.read() as conn:
        claim_owner = (
            await conn.execute(
                select(dispatch_queue.c.owner_instance_id).where(dispatch_queue.c.job_id == job_id)
            )
        ).scalar_one()
    assert claim_owner == "c2"
    assert await leader.sweep_lapsed_windows(timedelta(0)) == 0  # taken back once


async def test_the_leaders_cancel_reaches_a_worker_connected_only_to_a_sibling_coordinator(
    database: Database,
) -> None:
    # The owner c1 is gone; w1, which held the job, is connected to c3 but not to the leader c2: the
    # sweep's `job.cancel` goes through c3 (docs/design/cluster.md §4.4), which passes it on to w1 and no one
    # else.
    job_id = await lapsed_under_a_gone_owner(database)
    leader_peers = Peers("w2", coordinators=("c3",))
    leader = reroute_service(database, leader_peers, owner="c2")
    seen(leader, "w2", slots=1)
    assert await leader.sweep_lapsed_windows(timedelta(0)) == 1
    (relay,) = leader_peers.sessions["c3"].sent
    assert (relay["type"], relay["worker"]) == ("job.cancel.relay", "w1")
    assert (relay["cancel"]["job_id"], relay["cancel"]["reason"]) == (job_id, "rerouted")

    sibling_peers = Peers("w1", "w2", coordinators=("c2",))
    sibling = reroute_service(database, sibling_peers, owner="c3")
    message = JobCancelRelay.model_validate(relay)
    await sibling.on_cancel_relay(sibling_peers.sessions["c2"], message)
    assert [(m["type"], m["job_id"]) for m in sibling_peers.sessions["w1"].sent] == [("job.cancel", job_id)]
    assert sibling_peers.sessions["w2"].sent == []
    # A worker may not make a coordinator cancel on another worker.
    await sibling.on_cancel_relay(sibling_peers.sessions["w2"], message)
    assert len(sibling_peers.sessions["w1"].sent) == 1


# --- relayed spawn failures, Layer B (docs/design/cluster.md §4.3)


async def provisioning_error(db: Database, job_id: str) -> str | None:
    async with db.read() as conn:
        return (
            await conn.execute(
                select(dispatch_queue.c.last_provisioning_error).where(dispatch_queue.c.job_id == job_id)
            )
        ).scalar_one()


async def test_a_not_final_failure_from_the_holder_counts_and_rearms_the_window(database: Database) -> None:
    from conveyor.db.tables import run_timeline

    peers = Peers("w1", "w2")
    service = reroute_service(
        database, peers, reroute_spawn_max_attempts=3, reroute_spawn_retry_backoff_ms=700
    )
    seen(service, "w1", slots=2)
    seen(service, "w2", slots=1)
    job_id = await held_by(database, service, peers, "w1")
    before = utc_now()
    relay = give_back(job_id, final=False).model_copy(update={"attempt": 1, "detail": "boom"})
    await service.on_scaler_event("w1", relay)
    row = await job_row(database, job_id)
    assert (row.rerouted_to, row.reroute_spawn_failures) == ("w1", 1)
    assert timedelta(milliseconds=60_600) <= row.reroute_window_expires_at - before <= timedelta(seconds=62)
    assert job_id in service.windows and offers(peers, "w2") == []
    assert await provisioning_error(database, job_id) == "worker w1: attempt 1 failed: boom"
    async with database.read() as conn:
        (entry,) = list(await conn.execute(select(run_timeline).where(run_timeline.c.job_id == job_id)))
    assert entry.kind == "scaler.failed" and entry.detail["final"] is False and entry.detail["worker"] == "w1"


async def test_the_max_attempts_th_not_final_failure_counts_as_final(database: Database) -> None:
    peers = Peers("w1", "w2")
    service = reroute_service(database, peers, reroute_spawn_max_attempts=2)
    seen(service, "w1", slots=2)
    seen(service, "w2", slots=1)
    job_id = await held_by(database, service, peers, "w1")
    await service.on_scaler_event("w1", give_back(job_id, final=False))
    assert offers(peers, "w2") == []
    await service.on_scaler_event("w1", give_back(job_id, final=False))
    (offer,) = offers(peers, "w2")
    assert (offer["job_id"], offer["hop"]) == (job_id, 2)
    assert service.metrics.redispatches.labels("cap")._value.get() == 1


async def test_a_failure_without_final_is_recorded_and_keeps_the_deadline(database: Database) -> None:
    peers = Peers("w1", "w2")
    service = reroute_service(database, peers)
    seen(service, "w1", slots=2)
    seen(service, "w2", slots=1)
    job_id = await held_by(database, service, peers, "w1")
    deadline = (await job_row(database, job_id)).reroute_window_expires_at
    for _ in range(3):
        await service.on_scaler_event("w1", give_back(job_id, final=None))
    row = await job_row(database, job_id)
    assert (row.rerouted_to, row.reroute_spawn_failures, row.reroute_window_expires_at) == ("w1", 0, deadline)
    assert await provisioning_error(database, job_id) == "worker w1: attempt 2 failed: spawn failed"
    assert offers(peers, "w2") == []


async def test_failures_relayed_by_a_peer_that_does_not_hold_the_job_are_not_recorded(
    database: Database,
) -> None:
    peers = Peers("w1", "w2")
    service = reroute_service(database, peers)
    seen(service, "w1", slots=2)
    seen(service, "w2", slots=1)
    job_id = await held_by(database, service, peers, "w1")
    for final in (False, False, True):
        await service.on_scaler_event("w2", give_back(job_id, final=final))
    row = await job_row(database, job_id)
    assert (row.rerouted_to, row.reroute_spawn_failures) == ("w1", 0)
    assert await provisioning_error(database, job_id) is None


async def test_a_deposed_leaders_sweep_takes_nothing_back(database: Database) -> None:
    from contextlib import asynccontextmanager

    from sqlalchemy.ext.asyncio import AsyncConnection

    from conveyor.runtime.lease import LeaseLost

    job_id = await lapsed_under_a_gone_owner(database)
    leader_peers = Peers("w1", "w2")
    leader = reroute_service(database, leader_peers, owner="c2")
    seen(leader, "w2")

    @asynccontextmanager
    async def deposed() -> AsyncIterator[AsyncConnection]:
        async with database.transaction() as conn:
            raise LeaseLost("the lease moved on")
            yield conn

    with pytest.raises(LeaseLost):
        await leader.sweep_lapsed_windows(timedelta(0), deposed)
    row = await job_row(database, job_id)
    assert row.rerouted_to == "w1" and row.reroute_window_expires_at is not None
    assert offers(leader_peers, "w2") == [] and leader_peers.sessions["w1"].sent == []


async def test_each_not_final_failure_moves_the_window_later(database: Database) -> None:
    peers = Peers("w1")
    service = reroute_service(
        database, peers, reroute_spawn_max_attempts=3, reroute_spawn_retry_backoff_ms=700
    )
    seen(service, "w1", slots=2)
    job_id = await held_by(database, service, peers, "w1")
    deadlines = []
    for attempt in (1, 2):
        relay = give_back(job_id, final=False).model_copy(update={"attempt": attempt, "detail": "boom"})
        await service.on_scaler_event("w1", relay)
        row = await job_row(database, job_id)
        assert (row.rerouted_to, row.reroute_spawn_failures) == ("w1", attempt)
        deadlines.append(row.reroute_window_expires_at)
    assert deadlines[1] > deadlines[0]
    assert not await service.window_lapsed(job_id, "w1"), "the second re-arm's deadline has not come"


# --- a log per dispatch attempt (docs/design/execution.md §9)


def _chunk(job_id: str, seq: int, text: str, attempt: int | None, hop: int | None = 1) -> LogChunkRelay:
    return LogChunkRelay(
        job_id=job_id,
        step_index=1,
        seq=seq,
        lines=[{"stream": "out", "text": text}],
        attempt=attempt,
        hop=hop if attempt is not None else None,
    )


async def _taken_back_before_its_start(db: Database, job_id: str) -> None:
    """The job's worker goes silent past the flap grace before its start was heard: back to the queue."""

    async def silent(_worker: str) -> bool:
        return False

    settings = SweepSettings(unroutable_grace_ms=_zero, dead_after_ms=1000, rerouted_job_deferred=silent)
    async with db.transaction() as conn:
        await heartbeat_check(conn, settings, utc_now())
    assert await queue_state(db, job_id) == "pending"


async def _shown_log(db: Database, job_id: str, step: int | None = 1) -> str:
    async with db.read() as conn:
        found = await log_store.read_range(conn, job_id, step=step, offset=0, limit_bytes=65_536)
    assert found is not None and found.complete
    return found.text


@pytest.mark.parametrize("named", [True, False], ids=["attempts-named", "previous-version-workers"])
async def test_a_job_run_again_after_its_worker_was_cut_off_shows_only_the_log_of_the_run_that_counts(
    database: Database, named: bool
) -> None:
    # Found by the chaos harness (issue 44, seed 4701): a cut-off worker ran the job and its first chunks
    # were stored; the job went back to the queue and another worker ran it again, whose chunks with the
    # same seq were taken for duplicates: the log showed seq 0-1 of one run and 2-3 of the other.
    peers = Peers("w1", "w2")
    service = reroute_service(database, peers)
    service.append_log = log_store.append_protocol_chunk
    job_id = await accepted(database, service, "w1")
    for seq in (0, 1):
        await service.on_log_chunk("w1", _chunk(job_id, seq, f"first run {seq}", 1 if named else None))
    await _taken_back_before_its_start(database, job_id)

    await accepted(database, service, "w2", job_id=job_id)
    await service.on_progress("w2", progress(job_id, "running", data={"agent_id": "agent-2"}))
    for seq in range(4):
        await service.on_log_chunk("w2", _chunk(job_id, seq, f"second run {seq}", 2 if named else None))
    await service.on_progress(
        "w2",
        progress(job_id, "success", final_steps=FINAL_STEPS, **({"attempt": 2, "hop": 1} if named else {})),
    )

    assert (await job_row(database, job_id)).status == "success"
    assert await _shown_log(database, job_id) == "".join(f"second run {seq}\n" for seq in range(4))
    assert "first run" not in await _shown_log(database, job_id, step=None)


async def test_a_job_offered_again_to_the_worker_still_running_it_keeps_its_whole_log(
    database: Database,
) -> None:
    # Dropping the log at the requeue (the reverted first fix) lost this case's first chunks: the worker
    # answers the second offer as a duplicate and goes on with the execution the first offer began.
    peers = Peers("w1")
    service = reroute_service(database, peers)
    service.append_log = log_store.append_protocol_chunk
    job_id = await accepted(database, service, "w1")
    for seq in (0, 1):
        await service.on_log_chunk("w1", _chunk(job_id, seq, f"line {seq}", 1))
    await _taken_back_before_its_start(database, job_id)

    await accepted(database, service, "w1", job_id=job_id, duplicate=True)
    for seq in (2, 3):
        await service.on_log_chunk("w1", _chunk(job_id, seq, f"line {seq}", 1))
    await service.on_progress("w1", progress(job_id, "success", final_steps=FINAL_STEPS, attempt=1, hop=1))

    row = await job_row(database, job_id)
    assert (row.status, row.log_attempt, row.log_hop) == ("success", 1, 1)
    assert await _shown_log(database, job_id) == "".join(f"line {seq}\n" for seq in range(4))


@pytest.mark.parametrize("named", [True, False], ids=["attempts-named", "previous-version-workers"])
async def test_a_job_taken_back_from_a_worker_that_had_begun_it_shows_only_the_next_workers_log(
    database: Database, named: bool
) -> None:
    # A job taken back from its worker before its start was heard (here the worker gives it back; a lapsed
    # spawn window does the same for a frozen one) goes onwards at the same dispatch attempt: the offer's hop
    # tells the two executions apart.
    peers = Peers("w1", "w2")
    service = reroute_service(database, peers)
    service.append_log = log_store.append_protocol_chunk
    seen(service, "w1", slots=2)
    seen(service, "w2", slots=1)
    job_id = await held_by(database, service, peers, "w1")
    for seq in (0, 1):
        await service.on_log_chunk("w1", _chunk(job_id, seq, f"first worker {seq}", 1 if named else None, 1))
    await service.on_scaler_event("w1", give_back(job_id))

    (offer,) = offers(peers, "w2")
    assert (offer["attempt"], offer["hop"]) == (1, 2)
    await service.on_ack("w2", JobRerouteAck(message_id=offer["message_id"], job_id=job_id, accepted=True))
    await service.on_progress("w2", progress(job_id, "running", data={"agent_id": "agent-2"}))
    for seq in range(3):
        await service.on_log_chunk("w2", _chunk(job_id, seq, f"next worker {seq}", 1 if named else None, 2))
    await service.on_progress(
        "w2",
        progress(job_id, "success", final_steps=FINAL_STEPS, **({"attempt": 1, "hop": 2} if named else {})),
    )

    assert (await job_row(database, job_id)).status == "success"
    assert await _shown_log(database, job_id) == "".join(f"next worker {seq}\n" for seq in range(3))
