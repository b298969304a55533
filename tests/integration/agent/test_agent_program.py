"""`conveyor agent` for real (a subprocess) against a scripted fake orchestrator.

What is real: the agent process, its runner and step processes, the git checkout over file://, the outbox on
disk. What is fake: the orchestrator side of `/ws` (`tests/support/fake_orchestrator.py`).
"""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from conveyor.model import protocol as p
from tests.integration.agent.conftest import AgentProcess, until
from tests.support.fake_orchestrator import FakeAgentConnection, FakeOrchestrator, job_dispatch
from tests.support.repos import make_repo

pytestmark = pytest.mark.slow


async def close_seen(connection: FakeAgentConnection) -> int | None:
    """The close code the fake orchestrator saw, once it saw the close: the agent's process can exit
    before the fake's handler has read the close frame."""
    await until(lambda: connection.closed, what="the fake orchestrator to see the connection close")
    return connection.closed_code


Start = Callable[..., AgentProcess]


def log_text(messages: list[dict[str, object]]) -> str:
    return "\n".join(
        str(line["text"])  # type: ignore[index]
        for message in messages
        if message["type"] == "log.chunk"
        for line in message["lines"]  # type: ignore[attr-defined]
    )


async def test_a_job_runs_and_its_status_leaves_the_outbox_once_acknowledged(
    fake: FakeOrchestrator, ci_repo: Path, agents: Start
) -> None:
    agent = agents(fake.url, env={"CONVEYOR_AGENT_HEARTBEAT_MS": "200"})
    connection = await until(fake.registered, what="the agent to register")
    register = connection.register
    assert register is not None
    assert register["capacity"] == 1 and register["ephemeral"] is False
    assert register["labels"][0] == "linux"
    assert {label.split(":")[1] for label in register["labels"][1:]} == {"os", "arch", "host"}
    assert register["unacked_jobs"] == [] and register["in_flight"] == []
    assert connection.messages[0]["token"] == "cvy_agent_test_token"
    assert (agent.home / "agent_id").read_text().strip() == register["agent_id"]

    dispatch = {**job_dispatch(ci_repo), "attempt": 2}
    second = job_dispatch(ci_repo, job="test")
    await fake.dispatch(dispatch)
    await fake.dispatch(second)  # capacity 1: the first one is running
    job_id = dispatch["job_id"]

    finished = await until(
        lambda: [m for m in connection.of_type("job.finished") if m["job_id"] == job_id],
        what=f"job.finished:\n{agent.output()}",
    )
    assert finished[0]["status"] == "success", finished
    assert connection.of_type("job.ack") == [{"type": "job.ack", "re": dispatch["id"], "job_id": job_id}]
    [reject] = connection.of_type("job.reject")
    assert (reject["re"], reject["job_id"], reject["reason"]) == (second["id"], second["job_id"], "busy")
    types = [m["type"] for m in connection.messages if m.get("job_id") == job_id]
    assert types.index("job.ack") < types.index("job.started") < types.index("step.started")
    assert types[-1] == "job.finished"
    started = connection.of_type("step.started")
    assert [(m["name"], m["kind"]) for m in started][:2] == [("setup", "setup"), ("build", "step")]
    assert "building" in log_text(connection.messages)
    chunks = [(m["step_index"], m["seq"]) for m in connection.of_type("log.chunk")]
    for index in {i for i, _ in chunks}:
        seqs = [seq for i, seq in chunks if i == index]
        assert seqs == list(range(len(seqs))), "log.chunk seq counts per step from 0"
    # Chunks and the result name the dispatch's attempt: the orchestrator keeps a log per attempt.
    assert {m["attempt"] for m in connection.of_type("log.chunk")} == {2} and finished[0]["attempt"] == 2
    durable = [m for m in connection.messages if m["type"] in ("step.finished", "job.finished")]
    assert [m["oseq"] for m in durable] == list(range(1, len(durable) + 1))

    # Acknowledged: the watermark covers everything and the outbox file is truncated.
    last = durable[-1]["oseq"]
    await until(
        lambda: json.loads((agent.home / "outbox.acked").read_text())["watermark"] == last,
        what="the watermark to reach the last oseq",
    )
    await until(lambda: agent.outbox_lines() == [], what="the outbox to be truncated")
    await until(lambda: not (agent.home / "work" / job_id).exists(), what="the workspace to be removed")

    heartbeats = await until(lambda: connection.of_type("heartbeat"), what="a heartbeat")
    assert heartbeats[-1]["free_slots"] in (0, 1) and heartbeats[-1]["draining"] is False

    agent.proc.send_signal(signal.SIGTERM)
    assert await agent.wait_exit() == 0
    assert await close_seen(connection) == p.CLOSE_NORMAL


async def test_withheld_acks_and_a_dropped_connection_replay_the_same_oseq_after_register_ack(
    fake: FakeOrchestrator, ci_repo: Path, agents: Start
) -> None:
    agent = agents(fake.url)
    first = await until(fake.registered, what="the agent to register")
    fake.ack_statuses = False
    dispatch = job_dispatch(ci_repo)
    job_id = dispatch["job_id"]
    await fake.dispatch(dispatch)
    [finished] = await until(lambda: first.of_type("job.finished"), what=f"job.finished:\n{agent.output()}")
    sent = [m for m in first.messages if m["type"] in ("step.finished", "job.finished")]
    assert [e["oseq"] for e in agent.outbox_lines()] == [m["oseq"] for m in sent]

    fake.ack_statuses = True
    fake.drop()
    second = await until(
        lambda: fake.registered() if fake.current is not first else None,
        what=f"the agent to reconnect:\n{agent.output()}",
    )
    assert second.register is not None
    assert second.register["unacked_jobs"] == [job_id]
    assert second.register["in_flight"] == []
    replayed = await until(
        lambda: (
            [m for m in second.messages if m["type"] in ("step.finished", "job.finished")]
            if second.of_type("job.finished")
            else None
        ),
        what="the replay",
    )
    assert replayed == sent, "the same entries, same oseq, in oseq order"
    assert second.registered_at is not None
    assert second.messages.index(replayed[0]) >= second.registered_at, "replayed only after register.ack"
    assert finished in replayed
    await until(lambda: agent.outbox_lines() == [], what="the outbox to empty after the acks")


async def test_an_agent_killed_before_the_ack_replays_its_job_finished_exactly_once(
    fake: FakeOrchestrator, ci_repo: Path, agents: Start
) -> None:
    agent = agents(fake.url)
    first = await until(fake.registered, what="the agent to register")
    fake.ack_statuses = False
    dispatch = job_dispatch(ci_repo)
    job_id = dispatch["job_id"]
    await fake.dispatch(dispatch)
    [finished] = await until(lambda: first.of_type("job.finished"), what=f"job.finished:\n{agent.output()}")
    # It was fsync'ed before it was sent: it is on disk now, unacknowledged.
    assert finished in agent.outbox_lines()
    agent.proc.kill()
    agent.proc.wait(timeout=10)

    fake.ack_statuses = True
    restarted = agents(fake.url)
    second = await until(
        lambda: fake.registered() if fake.current is not first else None,
        what=f"the restarted agent to register:\n{restarted.output()}",
    )
    assert second.register is not None
    assert second.register["agent_id"] == first.register["agent_id"]  # type: ignore[index]
    assert second.register["unacked_jobs"] == [job_id]
    await until(lambda: restarted.outbox_lines() == [], what="the outbox to empty after the acks")
    replayed = [m for m in second.of_type("job.finished")]
    assert replayed == [finished], "replayed exactly once, same oseq"

    # A second restart has nothing left to replay.
    restarted.proc.send_signal(signal.SIGTERM)
    assert await restarted.wait_exit() == 0
    third_agent = agents(fake.url)
    third = await until(
        lambda: fake.registered() if fake.current is not second else None,
        what=f"a third registration:\n{third_agent.output()}",
    )
    assert third.register is not None and third.register["unacked_jobs"] == []
    assert fake.all_messages("job.finished").count(finished) == 2  # the original send and one replay


async def test_the_agent_sends_its_register_without_waiting_for_auth_success(agents: Start) -> None:
    # One round trip: a fake that answers auth.request only after agent.register has arrived.
    async with FakeOrchestrator(auth_after_register=True) as fake:
        agent = agents(fake.url)
        connection = await until(fake.registered, what=f"the agent to register:\n{agent.output()}")
        assert [m["type"] for m in connection.messages[:2]] == ["auth.request", "agent.register"]


async def test_auth_failure_exits_3_without_retrying(ci_repo: Path, agents: Start) -> None:
    async with FakeOrchestrator(refuse_auth="unknown token") as fake:
        agent = agents(fake.url)
        assert await agent.wait_exit() == 3
        assert len(fake.connections) == 1
        assert (
            fake.connections[0].closed_code is None or fake.connections[0].closed_code == p.CLOSE_AUTH_FAILED
        )
        assert "unknown token" in agent.output()


async def test_close_4010_after_registering_exits_3(fake: FakeOrchestrator, agents: Start) -> None:
    agent = agents(fake.url)
    await until(fake.registered, what="the agent to register")
    await fake.close(p.CLOSE_AUTH_FAILED, "token revoked")
    assert await agent.wait_exit() == 3
    assert len(fake.connections) == 1


async def test_an_ephemeral_agent_runs_one_job_and_exits_0_once_acknowledged(
    fake: FakeOrchestrator, ci_repo: Path, agents: Start
) -> None:
    agent = agents(fake.url, "--ephemeral")
    connection = await until(fake.registered, what="the agent to register")
    assert connection.register is not None and connection.register["ephemeral"] is True
    fake.ack_statuses = False
    dispatch = job_dispatch(ci_repo)
    await fake.dispatch(dispatch)
    [finished] = await until(
        lambda: connection.of_type("job.finished"), what=f"job.finished:\n{agent.output()}"
    )
    assert finished["status"] == "success"
    another = job_dispatch(ci_repo, job="test")
    await fake.dispatch(another)
    [reject] = await until(lambda: connection.of_type("job.reject"), what="the second job to be rejected")
    assert reject["reason"] == "draining"
    assert agent.proc.poll() is None, "an ephemeral agent waits for its outbox to empty"
    for message in connection.messages:
        if message["type"] in ("step.finished", "job.finished"):
            await fake.ack(message["oseq"])
    assert await agent.wait_exit() == 0
    assert agent.outbox_lines() == []
    assert await close_seen(connection) == p.CLOSE_NORMAL


async def test_drain_finishes_and_exits_0(fake: FakeOrchestrator, ci_repo: Path, agents: Start) -> None:
    agent = agents(fake.url)
    connection = await until(fake.registered, what="the agent to register")
    await fake.send(p.AgentDrain(reason="scale down"))
    assert await agent.wait_exit() == 0
    assert await close_seen(connection) == p.CLOSE_NORMAL


SLOW_WORKFLOW = """
from conveyor import push, workflow

w = workflow("slow", on=[push(branches=["main"])])

@w.job(runs_on=["linux"])
def wait(ctx):
    import time
    event_id = ctx.emit("slow.started", {"n": 1})
    print("ready", event_id, flush=True)
    time.sleep(120)
"""


@pytest.fixture(scope="session")
def slow_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A repository whose only job emits an event, prints `ready`, then sleeps for two minutes."""
    return make_repo(tmp_path_factory.mktemp("agent-program-slow") / "repo", {"slow": SLOW_WORKFLOW})


async def test_cancel_and_sigterm_end_running_jobs_cancelled_and_the_agent_exits_0(
    fake: FakeOrchestrator, slow_repo: Path, agents: Start
) -> None:
    agent = agents(fake.url, "--capacity", "2")
    connection = await until(fake.registered, what="the agent to register")
    first, second = job_dispatch(slow_repo, "slow", "wait"), job_dispatch(slow_repo, "slow", "wait")
    await fake.dispatch(first)
    await fake.dispatch(second)
    await until(
        lambda: sum(line.startswith("ready ") for line in log_text(connection.messages).splitlines()) == 2,
        what=f"both jobs to be running:\n{agent.output()}",
    )
    emits = connection.of_type("event.emit")
    assert {e["job_id"] for e in emits} == {first["job_id"], second["job_id"]}
    assert all(e["name"] == "slow.started" and e["payload"] == {"n": 1} for e in emits)
    assert all(e["oseq"] >= 1 for e in emits)

    # The orchestrator cancels one job: it ends cancelled, the other keeps running.
    await fake.send(p.JobCancel(job_id=first["job_id"], reason="user"))
    [cancelled] = await until(
        lambda: connection.of_type("job.finished"), what=f"the cancelled job to finish:\n{agent.output()}"
    )
    assert (cancelled["job_id"], cancelled["status"]) == (first["job_id"], "cancelled")
    # SIGTERM: the running job is cancelled gracefully, its status acknowledged, exit 0.
    agent.proc.send_signal(signal.SIGTERM)
    assert await agent.wait_exit(timeout=60) == 0
    ends = {m["job_id"]: m for m in connection.of_type("job.finished")}
    assert ends[second["job_id"]]["status"] == "cancelled"
    assert agent.outbox_lines() == []
    assert await close_seen(connection) == p.CLOSE_NORMAL


def group_alive(pgid: int) -> bool:
    """Whether any non-zombie process is in group `pgid`."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


async def test_a_restarted_agent_kills_the_process_groups_a_crashed_one_left(
    fake: FakeOrchestrator, slow_repo: Path, agents: Start
) -> None:
    agent = agents(fake.url)
    connection = await until(fake.registered, what="the agent to register")
    dispatch = job_dispatch(slow_repo, "slow", "wait")
    await fake.dispatch(dispatch)
    await until(lambda: "ready" in log_text(connection.messages), what=f"the job to run:\n{agent.output()}")
    running = json.loads((agent.home / "running.json").read_text())
    groups = running["jobs"][dispatch["job_id"]]
    assert len(groups) >= 2, "the runner and at least the step's group"
    agent.proc.kill()
    agent.proc.wait(timeout=10)
    assert any(group_alive(pgid) for pgid in groups), "the runner outlives a SIGKILLed agent"

    restarted = agents(fake.url)
    second = await until(
        lambda: fake.registered() if fake.current is not connection else None,
        what=f"the restarted agent to register:\n{restarted.output()}",
    )
    assert second.register is not None and second.register["in_flight"] == []
    await until(
        lambda: not any(group_alive(pgid) for pgid in groups), what="the leftover groups to be killed"
    )
    assert not (restarted.home / "running.json").exists()
    assert not (restarted.home / "work" / dispatch["job_id"]).exists()
