"""Worker mode without processes: agent tokens in memory, held jobs, relays, outbox order, drain seams."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from conveyor.cluster.messages import (
    JobCancelRequest,
    JobProgressAck,
    LogChunkRelay,
    ScalerInventory,
)
from conveyor.cluster.outbox import Outbox
from conveyor.cluster.worker import LogRelayBuffer, MemoryAgentTokens, RelayedLogs, WorkerService
from conveyor.model import protocol as p
from conveyor.model.ids import utc_now
from tests.support.worker_units import SECRET, FakePeers, FakeSession, reroute, service


class FakeAgent:
    """An agent connection as the journal sees it."""

    def __init__(self, agent_id: str = "a1") -> None:
        self.agent_id = agent_id
        self.jobs: set[str] = set()
        self.pending_acks: dict[str, str] = {}
        self.answered: set[str] = set()
        self.sent: list[Any] = []
        self.draining = False
        self.busy_until = 0.0
        self.idle = 0.0
        self.closed_with: int | None = None

    async def send(self, message: Any) -> bool:
        self.sent.append(message)
        return True

    def free_slot(self) -> Any:
        from conveyor.execution.queue import AgentSlot

        return None if self.jobs else AgentSlot(self.agent_id, ("linux",), ())

    def idle_since(self) -> float:
        return 0.0

    def bound_job_id(self) -> str | None:
        return None

    async def offer(self, dispatch: p.JobDispatch) -> bool:
        self.jobs.add(dispatch.job_id)
        self.sent.append(dispatch)
        return True

    async def close(self, code: int, reason: str = "") -> None:
        self.closed_with = code


async def hold_on_agent(worker: WorkerService, agent: FakeAgent, job_id: str = "job-1") -> None:
    assert worker.accept(reroute(job_id), "c1").accepted
    worker.dispatcher.agents[agent.agent_id] = agent
    assert await worker.dispatcher.dispatch_round() == 1


# --- tokens


def test_a_minted_token_authenticates_once_and_only_its_hash_is_kept() -> None:
    tokens = MemoryAgentTokens()
    token, token_id = tokens.mint(
        labels=["linux"],
        mandatory_labels=[],
        agent_id="a1",
        expires_at=utc_now() + timedelta(hours=1),
        label="s",
    )
    assert token not in repr(tokens.__dict__)
    row = tokens.authenticate(token)
    assert not isinstance(row, p.AuthFailure) and getattr(row, "id", None) == token_id
    assert getattr(tokens.authenticate(token), "reason", None) == "consumed"
    assert getattr(tokens.authenticate("cvy_agent_" + "0" * 64), "reason", None) == "unknown_token"


def test_an_expired_token_is_refused() -> None:
    tokens = MemoryAgentTokens()
    token, _ = tokens.mint(
        labels=[], mandatory_labels=[], agent_id="a1", expires_at=utc_now() - timedelta(seconds=1), label="s"
    )
    assert getattr(tokens.authenticate(token), "reason", None) == "expired"


def test_an_agent_cannot_claim_another_agents_identity() -> None:
    tokens = MemoryAgentTokens()
    later = utc_now() + timedelta(hours=1)
    _, first = tokens.mint(labels=[], mandatory_labels=[], agent_id="a1", expires_at=later, label="s")
    _, second = tokens.mint(labels=[], mandatory_labels=[], agent_id="a2", expires_at=later, label="s")
    assert tokens.bind(first, "a1") is None
    assert tokens.bind(second, "a1") is not None  # a1 belongs to the first token
    assert tokens.bind(first, "a3") is not None  # and the first token to a1


def test_a_revoked_token_is_forgotten() -> None:
    tokens = MemoryAgentTokens()
    token, token_id = tokens.mint(
        labels=[], mandatory_labels=[], agent_id="a1", expires_at=utc_now() + timedelta(hours=1), label="s"
    )
    tokens.revoke(token_id)
    assert len(tokens) == 0 and getattr(tokens.authenticate(token), "reason", None) == "unknown_token"


# --- log buffer


def chunk(seq: int, text: str) -> LogChunkRelay:
    return LogChunkRelay(job_id="j", step_index=1, seq=seq, lines=[{"stream": "out", "text": text}])


def test_the_log_buffer_drops_past_its_limit_and_marks_the_gap_once() -> None:
    buffer = LogRelayBuffer(limit=10)
    buffer.add(chunk(0, "12345"))
    buffer.add(chunk(1, "123456"))  # would pass 10 bytes: dropped
    buffer.add(chunk(2, "12345"))
    assert [c.seq for c in buffer.drain()] == [0, 2]
    marker = buffer.gap_marker()
    assert marker is not None and marker["stream"] == "sys" and "1 log line dropped" in marker["text"]
    assert buffer.gap_marker() is None


# --- offers


def test_an_offer_with_room_is_held_and_a_resend_is_a_duplicate(tmp_path: Path) -> None:
    worker, _ = service(tmp_path)
    first = worker.accept(reroute(), "c1")
    again = worker.accept(reroute(), "c1")
    assert first.accepted and not first.duplicate
    assert again.accepted and again.duplicate
    assert worker.held_jobs_not_started() == ["job-1"]


def test_room_already_spoken_for_by_a_waiting_job_is_no_capacity(tmp_path: Path) -> None:
    worker, _ = service(tmp_path, scaler_room=1)
    assert worker.accept(reroute("job-1"), "c1").accepted
    answer = worker.accept(reroute("job-2"), "c1")
    assert not answer.accepted and answer.reason == "no-capacity"


def test_a_draining_worker_refuses_new_offers(tmp_path: Path) -> None:
    worker, _ = service(tmp_path)
    worker.drain.draining = True
    answer = worker.accept(reroute(), "c1")
    assert not answer.accepted and answer.reason == "draining"
    assert worker.jobs == {}


def test_an_offer_for_other_labels_is_no_capacity(tmp_path: Path) -> None:
    worker, _ = service(tmp_path)
    macos = {"runs_on": {"labels": [{"kind": "exact", "pattern": "macos", "flags": ""}], "exclude": []}}
    answer = worker.accept(reroute(labels=macos), "c1")
    assert not answer.accepted and answer.reason == "no-capacity"


def test_the_reroute_message_never_prints_its_secrets() -> None:
    message = reroute()
    assert SECRET not in repr(message) and SECRET not in str(message)


async def test_the_job_credential_reaches_the_agent_is_masked_and_goes_with_the_job(tmp_path: Path) -> None:
    # docs/design/artifacts.md §4 "Workers": the coordinator's credential, for the agent's transfers.
    token = "cvy_job_" + "f" * 64
    worker, session = service(tmp_path)
    agent = FakeAgent()
    assert worker.accept(reroute(job_token=token), "c1").accepted
    worker.dispatcher.agents[agent.agent_id] = agent
    assert await worker.dispatcher.dispatch_round() == 1
    (dispatch,) = [m for m in agent.sent if isinstance(m, p.JobDispatch)]
    assert dispatch.artifacts is not None and dispatch.artifacts.token == token
    assert token not in repr(worker.jobs["job-1"].reroute)
    line = p.LogLine(text=f"leaked {token}")
    await worker.journal.apply(agent, p.LogChunk(job_id="job-1", step_index=1, seq=0, lines=[line]))
    (relayed,) = [m for m in session.sent if m["type"] == "log.chunk"]
    assert token not in relayed["lines"][0]["text"]
    held = worker.jobs["job-1"]
    await worker.give_back("job-1", "test")
    assert "job-1" not in worker.jobs and held.reroute.job_token is None


def test_an_offer_without_a_credential_dispatches_none(tmp_path: Path) -> None:
    # An older coordinator sends none: the agent then refuses its steps' transfers itself.
    worker, _ = service(tmp_path)
    assert worker.accept(reroute(), "c1").accepted
    assert worker.jobs["job-1"].dispatch().artifacts is None


# --- agent messages


async def test_logs_are_masked_before_they_leave_the_worker(tmp_path: Path) -> None:
    worker, session = service(tmp_path)
    agent = FakeAgent()
    await hold_on_agent(worker, agent)
    line = p.LogLine(text=f"key={SECRET} header=Authorization: token-zzz")
    await worker.journal.apply(agent, p.LogChunk(job_id="job-1", step_index=1, seq=0, lines=[line]))
    (relayed,) = [m for m in session.sent if m["type"] == "log.chunk"]
    assert SECRET not in relayed["lines"][0]["text"] and "token-zzz" not in relayed["lines"][0]["text"]


async def test_outputs_errors_and_emitted_payloads_are_masked_before_they_leave_the_worker(
    tmp_path: Path,
) -> None:
    worker, session = service(tmp_path)
    agent = FakeAgent()
    await hold_on_agent(worker, agent)
    outputs = {"key": SECRET, SECRET: ["x", {"auth": "Authorization: token-zzz"}]}
    masked = {"key": "***", "***": ["x", {"auth": "***"}]}
    await worker.journal.apply(
        agent,
        p.StepFinished(
            oseq=1, job_id="job-1", step_index=1, status="failed", error=f"bad {SECRET}", outputs=outputs
        ),
    )
    emit = p.EventEmit(oseq=2, request_id="req-1", job_id="job-1", name="deployed", payload=outputs)
    emitting = asyncio.create_task(worker.journal.apply(agent, emit))
    relayed = await _sent_of_type(session, "event.emit")
    emitting.cancel()
    await asyncio.gather(emitting, return_exceptions=True)
    await worker.journal.apply(
        agent, p.JobFinished(oseq=3, job_id="job-1", status="success", outputs={"first": outputs})
    )
    step, job = [m for m in session.sent if m["type"] == "job.progress"]
    assert step["data"]["outputs"] == masked and step["data"]["error"] == "bad ***"
    assert relayed["payload"] == masked
    assert job["data"]["outputs"] == {"first": masked} and job["final_steps"][0]["outputs"] == masked
    assert SECRET not in (tmp_path / "outbox" / "job-1.json").read_text()


async def test_relayed_chunks_and_the_result_name_the_attempt_of_the_agents_execution(tmp_path: Path) -> None:
    # The coordinator keeps a log per execution (docs/design/execution.md §9). An agent names the attempt
    # its execution began with (an earlier offer's, when the job was offered to it again while it ran); one
    # of the previous version names none, and the worker names the attempt it dispatched.
    worker, session = service(tmp_path)
    agent = FakeAgent()
    assert worker.accept(reroute("job-1", attempt=3), "c1").accepted
    worker.dispatcher.agents[agent.agent_id] = agent
    assert await worker.dispatcher.dispatch_round() == 1
    line = p.LogLine(text="building")
    await worker.journal.apply(
        agent, p.LogChunk(job_id="job-1", step_index=1, seq=0, lines=[line], attempt=2)
    )
    await worker.journal.apply(agent, p.LogChunk(job_id="job-1", step_index=1, seq=1, lines=[line]))
    await worker.journal.apply(agent, p.JobFinished(oseq=1, job_id="job-1", status="success", attempt=2))

    # Both carry the hop of the offer this worker holds: another worker offered the job at the same attempt
    # (a take-back) runs another execution.
    assert [(m["attempt"], m["hop"]) for m in session.sent if m["type"] == "log.chunk"] == [(2, 1), (3, 1)]
    (result,) = [m for m in session.sent if m["type"] == "job.progress"]
    assert (result["state"], result["attempt"], result["hop"]) == ("success", 2, 1)


async def test_the_result_is_in_the_outbox_before_the_agent_is_acknowledged(tmp_path: Path) -> None:
    worker, session = service(tmp_path)
    agent = FakeAgent()
    await hold_on_agent(worker, agent)
    outbox_when_acked: list[bool] = []
    original = agent.send

    async def send(message: Any) -> bool:
        if isinstance(message, p.StatusAck):
            outbox_when_acked.append("job-1" in worker.outbox)
        return await original(message)

    agent.send = send  # type: ignore[method-assign]
    await worker.journal.apply(agent, p.JobFinished(oseq=7, job_id="job-1", status="success"))
    assert outbox_when_acked == [True]
    (sent,) = [m for m in session.sent if m["type"] == "job.progress"]
    assert sent["state"] == "success" and sent["kind"] == "job"
    assert worker.jobs == {}  # secrets erased with the job
    file_text = (tmp_path / "outbox" / "job-1.json").read_text()
    assert SECRET not in file_text and "token-zzz" not in file_text

    assert await worker.handle(session, JobProgressAck(job_id="job-1", state="success"))
    assert "job-1" not in worker.outbox


async def test_a_message_about_another_agents_job_is_not_relayed(tmp_path: Path) -> None:
    worker, session = service(tmp_path)
    await hold_on_agent(worker, FakeAgent("a1"))
    await worker.journal.apply(FakeAgent("a2"), p.JobFinished(oseq=1, job_id="job-1", status="failed"))
    assert [m for m in session.sent if m["type"] == "job.progress"] == []
    assert "job-1" in worker.jobs


async def test_the_outbox_is_replayed_when_a_coordinator_connects(tmp_path: Path) -> None:
    worker, _ = service(tmp_path)
    worker.outbox.write("job-9", "c1", {"type": "job.progress", "job_id": "job-9", "state": "success"})
    fresh = FakeSession("c2")
    await worker.session_opened(fresh)
    assert [m["job_id"] for m in fresh.sent] == ["job-9"]


async def test_a_lost_agent_fails_its_started_job_and_requeues_an_unstarted_one(tmp_path: Path) -> None:
    worker, session = service(tmp_path, scaler_room=2)
    agent = FakeAgent()
    await hold_on_agent(worker, agent, "job-1")
    await worker.journal.apply(agent, p.JobStarted(job_id="job-1"))
    other = FakeAgent("a2")
    await hold_on_agent(worker, other, "job-2")
    await worker.journal.disconnected(agent, 1006)
    await worker.journal.disconnected(other, 1006)
    (failed,) = [
        m
        for m in session.sent
        if m["type"] == "job.progress" and m["kind"] == "job" and m["state"] != "running"
    ]
    assert (
        failed["job_id"] == "job-1"
        and failed["state"] == "failed"
        and failed["data"]["reason"] == "agent_lost"
    )
    assert worker.jobs["job-2"].state == "held"


# --- drain seams


async def test_give_back_relays_a_final_failure_and_drops_the_job(tmp_path: Path) -> None:
    worker, session = service(tmp_path)
    worker.accept(reroute(), "c1")
    assert await worker.give_back("job-1", "worker shutting down")
    (event,) = [m for m in session.sent if m["type"] == "scaler.event"]
    assert event["kind"] == "failed" and event["final"] is True and event["detail"] == "worker shutting down"
    assert worker.held_jobs_not_started() == []


async def test_running_jobs_are_counted_and_cancelled_on_their_agents(tmp_path: Path) -> None:
    worker, _ = service(tmp_path)
    agent = FakeAgent()
    await hold_on_agent(worker, agent)
    await worker.journal.apply(agent, p.JobStarted(job_id="job-1"))
    assert worker.running_jobs_count() == 1 and worker.held_jobs_not_started() == []
    assert not await worker.give_back("job-1", "x")  # a started job is not given back
    assert await worker.cancel_running("worker_shutdown") == 1
    assert [m.reason for m in agent.sent if isinstance(m, p.JobCancel)] == ["worker_shutdown"]


async def test_flush_outbox_waits_for_acks_until_its_timeout(tmp_path: Path) -> None:
    worker, session = service(tmp_path)
    worker.outbox.write("job-9", "c1", {"type": "job.progress", "job_id": "job-9", "state": "success"})

    async def ack_later() -> None:
        await asyncio.sleep(0)
        await worker.handle(session, JobProgressAck(job_id="job-9", state="success"))

    acking = asyncio.create_task(ack_later())
    assert await worker.flush_outbox(5) == 0
    await acking
    worker.outbox.write("job-8", "c1", {"type": "job.progress", "job_id": "job-8", "state": "success"})
    assert await worker.flush_outbox(0.05) == 1


async def test_a_coordinator_cancel_drops_a_job_no_agent_has(tmp_path: Path) -> None:
    worker, session = service(tmp_path)
    worker.accept(reroute(), "c1")
    await worker.handle(
        session, JobCancelRequest(run_id="run-1", job_id="job-1", reason="rerouted", force=True)
    )
    assert worker.jobs == {}


@pytest.mark.parametrize("role", ["worker"])
async def test_job_messages_from_a_non_coordinator_are_not_handled(tmp_path: Path, role: str) -> None:
    worker, _ = service(tmp_path)
    assert not await worker.handle(FakeSession("w2", role), reroute())


async def test_logs_buffered_while_disconnected_are_sent_before_the_result_on_reconnect(
    tmp_path: Path,
) -> None:
    worker, _ = service(tmp_path)
    agent = FakeAgent()
    await hold_on_agent(worker, agent)
    worker.peers.sessions.clear()  # the link is cut
    line = p.LogLine(text="while away")
    await worker.journal.apply(agent, p.LogChunk(job_id="job-1", step_index=1, seq=0, lines=[line]))
    await worker.journal.apply(agent, p.JobFinished(oseq=1, job_id="job-1", status="success"))
    assert worker.jobs == {} and "job-1" in worker.outbox

    back = FakeSession("c1")
    worker.peers.sessions["c1"] = back
    await worker.session_opened(back)
    assert [(m["type"], m["job_id"]) for m in back.sent] == [
        ("log.chunk", "job-1"),
        ("job.progress", "job-1"),
    ]
    assert worker.unsent_logs == {}


async def test_a_chunk_sent_to_a_coordinator_goes_again_to_the_next_session_until_the_jobs_end_is_acknowledged(
    tmp_path: Path,
) -> None:
    # Found by the chaos harness: a coordinator killed before reading a relayed chunk left a hole in the log.
    worker, first = service(tmp_path)
    agent = FakeAgent()
    await hold_on_agent(worker, agent)
    line = p.LogLine(text="sent, never read")
    await worker.journal.apply(agent, p.LogChunk(job_id="job-1", step_index=1, seq=0, lines=[line]))
    assert [m["type"] for m in first.sent].count("log.chunk") == 1
    await worker.journal.apply(agent, p.JobFinished(oseq=1, job_id="job-1", status="success"))

    back = FakeSession("c1")  # the coordinator died with both frames unread, and came back
    worker.peers.sessions["c1"] = back
    await worker.session_opened(back)
    assert [(m["type"], m["job_id"]) for m in back.sent] == [
        ("log.chunk", "job-1"),
        ("job.progress", "job-1"),
    ]
    assert back.sent[0]["lines"][0]["text"] == "sent, never read"

    await worker.handle(back, JobProgressAck(job_id="job-1", state="success"))
    again = FakeSession("c1")
    worker.peers.sessions["c1"] = again
    await worker.session_opened(again)
    assert again.sent == []


async def test_chunks_sent_to_a_coordinator_that_went_away_go_first_to_the_one_that_gets_the_rest(
    tmp_path: Path,
) -> None:
    # Found by the chaos harness (seed 4701): chunks 0-4 went to the job's coordinator, which was killed
    # unread; the rest and the result went to the other coordinator, whose acknowledgement of the result
    # then discarded chunks it never had (the log kept seq 5-10).
    worker, first = service(tmp_path)
    other = FakeSession("c2")
    worker.peers.sessions["c2"] = other
    agent = FakeAgent()
    await hold_on_agent(worker, agent)
    line = p.LogLine(text="to the first")
    await worker.journal.apply(agent, p.LogChunk(job_id="job-1", step_index=1, seq=0, lines=[line]))
    assert [m["type"] for m in first.sent].count("log.chunk") == 1 and other.sent == []

    del worker.peers.sessions["c1"]  # killed before it read the chunk
    later = p.LogLine(text="to the second")
    await worker.journal.apply(agent, p.LogChunk(job_id="job-1", step_index=1, seq=1, lines=[later]))
    await worker.journal.apply(agent, p.JobFinished(oseq=1, job_id="job-1", status="success"))
    assert [(m["type"], m.get("seq")) for m in other.sent] == [
        ("log.chunk", 0),
        ("log.chunk", 1),
        ("job.progress", None),
    ]
    assert other.sent[0]["lines"][0]["text"] == "to the first"

    await worker.handle(other, JobProgressAck(job_id="job-1", state="success"))
    back = FakeSession("c1")  # the first comes back after the second applied everything: nothing to send
    worker.peers.sessions["c1"] = back
    await worker.session_opened(back)
    assert back.sent == []


async def test_a_second_offer_of_a_job_that_ended_here_unacknowledged_is_a_duplicate_not_a_second_run(
    tmp_path: Path,
) -> None:
    # Found by the chaos harness (seed 44): c1 offered a job, the worker ran it to success while c1 was
    # frozen; c2 offered it again, the worker held it anew and ran it a second time after c1 recorded it.
    worker, _ = service(tmp_path)
    agent = FakeAgent()
    await hold_on_agent(worker, agent)
    await worker.journal.apply(agent, p.JobFinished(oseq=1, job_id="job-1", status="success"))
    assert "job-1" not in worker.jobs

    again = worker.accept(reroute("job-1"), "c2")
    assert again.accepted and again.duplicate and "job-1" not in worker.jobs

    await worker.handle(FakeSession("c1"), JobProgressAck(job_id="job-1", state="success"))
    later = worker.accept(reroute("job-1"), "c2")  # acknowledged: a new offer is a new job to hold
    assert later.accepted and not later.duplicate and "job-1" in worker.jobs


def test_relayed_chunks_past_the_limit_keep_the_newest() -> None:
    kept = RelayedLogs(limit=10)
    for seq in range(4):
        kept.sent("c1", LogChunkRelay(job_id="j", step_index=0, seq=seq, lines=[{"text": "abcd"}]))
    assert kept.owners() == [("j", "c1")]
    assert [c.seq for c in kept.behind("j", object())] == [2, 3]  # asked by a session they did not go on
    kept.keep_only({"other"})
    assert kept.owners() == [] and kept.behind("j", object()) == []


async def test_a_running_job_is_reported_running_again_when_its_coordinator_reconnects(
    tmp_path: Path,
) -> None:
    # Found by the chaos harness: the `running` progress was lost while the link was cut, the spawn window
    # stayed armed, and the coordinator took back (and ran elsewhere) a job that was running here.
    worker, _ = service(tmp_path)
    agent = FakeAgent()
    await hold_on_agent(worker, agent)
    worker.peers.sessions.clear()  # the link is cut
    await worker.journal.apply(agent, p.JobStarted(job_id="job-1"))
    assert worker.jobs["job-1"].state == "running"
    back = FakeSession("c1")
    worker.peers.sessions["c1"] = back
    await worker.session_opened(back)
    running = [m for m in back.sent if m["type"] == "job.progress"]
    assert [(m["job_id"], m["kind"], m["state"]) for m in running] == [("job-1", "job", "running")]
    other = FakeSession("c2")  # not the job's coordinator, which is connected: it is told nothing
    worker.peers.sessions["c2"] = other
    await worker.session_opened(other)
    assert not [m for m in other.sent if m["type"] == "job.progress"]


async def test_an_agents_emit_is_relayed_and_answered_with_the_coordinators_result(tmp_path: Path) -> None:
    from conveyor.cluster.messages import EventEmitResultRelay

    worker, session = service(tmp_path)
    agent = FakeAgent()
    await hold_on_agent(worker, agent)
    emit = p.EventEmit(oseq=3, request_id="req-1", job_id="job-1", name="deployed", payload={"v": 1})
    applying = asyncio.create_task(worker.journal.apply(agent, emit))
    relayed = await _sent_of_type(session, "event.emit")
    assert relayed["name"] == "deployed" and relayed["payload"] == {"v": 1}
    await worker.handle(
        session, EventEmitResultRelay(job_id="job-1", request_id="req-1", event_id="ev-9", created=True)
    )
    await applying
    results = [m for m in agent.sent if isinstance(m, p.EventEmitResult)]
    assert [(r.request_id, r.event_id, r.created) for r in results] == [("req-1", "ev-9", True)]
    assert [m.oseq for m in agent.sent if isinstance(m, p.StatusAck)] == [3]


async def _sent_of_type(session: FakeSession, message_type: str) -> dict[str, Any]:
    from tests.support.waiting import async_wait_until

    async def found() -> dict[str, Any] | None:
        return next((m for m in session.sent if m["type"] == message_type), None)

    return await async_wait_until(found, timeout=5, what=message_type)


async def test_a_user_cancel_of_a_job_no_agent_has_is_reported_cancelled_by_the_worker(
    tmp_path: Path,
) -> None:
    worker, session = service(tmp_path)
    worker.accept(reroute(), "c1")
    await worker.handle(session, JobCancelRequest(run_id="run-1", job_id="job-1", reason="cancelled_by"))
    (result,) = [m for m in session.sent if m["type"] == "job.progress"]
    assert result["state"] == "cancelled" and result["data"]["reason"] == "cancelled_by"
    assert worker.jobs == {} and "job-1" in worker.outbox


async def test_a_user_cancel_of_a_running_job_goes_to_its_agent_and_the_job_stays_until_it_reports(
    tmp_path: Path,
) -> None:
    worker, session = service(tmp_path)
    agent = FakeAgent()
    await hold_on_agent(worker, agent)
    await worker.journal.apply(agent, p.JobStarted(job_id="job-1"))
    await worker.handle(
        session, JobCancelRequest(run_id="run-1", job_id="job-1", reason="cancelled_by", force=True)
    )
    assert [(m.reason, m.force) for m in agent.sent if isinstance(m, p.JobCancel)] == [("cancelled_by", True)]
    assert "job-1" in worker.jobs


def test_room_taken_by_a_held_jobs_own_spawn_is_not_counted_twice(tmp_path: Path) -> None:
    worker, _ = service(tmp_path, scaler_room=2)
    assert worker.accept(reroute("job-1"), "c1").accepted
    worker.jobs["job-1"].bound_agent_id = "spawned-1"  # its spawn is in the scaler's active count now
    scalers = [
        ScalerInventory(name="local", backend="bare-metal", label_sets=[["linux"]], max_agents=2, active=1)
    ]
    worker.inventory = lambda: ([], scalers)
    assert worker.accept(reroute("job-2"), "c1").accepted


async def test_an_unacknowledged_result_is_resent_once_it_is_old_enough(tmp_path: Path) -> None:
    session = FakeSession()
    clock = [1000.0]
    worker = WorkerService(
        instance_id="w1", outbox=Outbox(tmp_path, clock=lambda: clock[0]), peers=FakePeers(session)
    )
    worker.outbox.write("job-1", "c1", {"type": "job.progress", "job_id": "job-1", "state": "success"})
    assert await worker.resend_unacknowledged() == 0  # just written: give the ack time
    clock[0] += 31
    assert await worker.resend_unacknowledged() == 1
    assert [m["job_id"] for m in session.sent] == ["job-1"]


# --- spawn retries within the job's budget (docs/design/cluster.md §4.3)


def failed_spawn(agent_id: str, job_id: str = "job-1") -> Any:
    from types import SimpleNamespace

    return SimpleNamespace(agent_id=agent_id, bound_job_id=job_id, token_id=None)


async def test_spawn_failures_are_retried_within_the_budget_then_the_job_is_given_back(
    tmp_path: Path,
) -> None:
    worker, session = service(tmp_path)
    clock = [100.0]
    worker.clock = lambda: clock[0]
    assert worker.accept(reroute(spawn_retry={"max_attempts": 3, "backoff_ms": 2000}), "c1").accepted
    records = worker.records
    for attempt in (1, 2):
        await records.spawn_failed(
            failed_spawn(f"s{attempt}"), outcome="failed", message="boom", log_tail=[], note=""
        )
        job = worker.jobs["job-1"]
        assert job.state == "held" and job.not_before == clock[0] + 2.0
        assert await records.pending_jobs(10) == []  # waits out the backoff
        clock[0] += 2.0
        assert [j.job_id for j in await records.pending_jobs(10)] == ["job-1"]
    await records.spawn_failed(failed_spawn("s3"), outcome="failed", message="boom", log_tail=[], note="")
    relays = [m for m in session.sent if m["type"] == "scaler.event"]
    assert [(r["attempt"], r["final"]) for r in relays] == [(1, False), (2, False), (3, True)]
    assert "job-1" not in worker.jobs  # given back: secrets erased with it


async def test_a_budget_of_one_gives_the_job_back_at_the_first_failure(tmp_path: Path) -> None:
    worker, session = service(tmp_path)
    assert worker.accept(reroute(spawn_retry={"max_attempts": 1, "backoff_ms": 0}), "c1").accepted
    await worker.records.spawn_failed(
        failed_spawn("s1"), outcome="failed", message="no", log_tail=[], note=""
    )
    (relay,) = [m for m in session.sent if m["type"] == "scaler.event"]
    assert (relay["attempt"], relay["final"], relay["job_id"]) == (1, True, "job-1")
    assert "job-1" not in worker.jobs


async def test_a_taken_back_job_stops_its_spawn_retries(tmp_path: Path) -> None:
    worker, session = service(tmp_path)
    assert worker.accept(reroute(spawn_retry={"max_attempts": 3, "backoff_ms": 0}), "c1").accepted
    await worker.records.spawn_failed(
        failed_spawn("s1"), outcome="failed", message="boom", log_tail=[], note=""
    )
    await worker.on_cancel(JobCancelRequest(run_id="run-1", job_id="job-1", reason="rerouted", force=True))
    assert "job-1" not in worker.jobs and await worker.records.pending_jobs(10) == []
    await worker.records.spawn_failed(
        failed_spawn("s2"), outcome="failed", message="late", log_tail=[], note=""
    )
    assert len([m for m in session.sent if m["type"] == "scaler.event"]) == 1
