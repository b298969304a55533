"""A single-use agent is sent one job and no other (docs/design/execution.md §5, "Single use").

An ephemeral agent gets one `job.dispatch` in its life, and an agent a scaler started for a job (its
token handed over by a redeemed `event` scaler claim here, docs/design/scaler.md §6.4) gets that job
or nothing: never a job bound to another spawn, nor an unbound one. A dispatch carries the job's
secrets, so the agent program refusing it would come too late. Real server process, scripted
protocol clients over real sockets, on SQLite and PostgreSQL.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from conveyor.model import protocol as p
from tests.support.dispatch_stage import FAST, Stage, stage
from tests.support.http import HTTP
from tests.support.protocol_agent import ScriptedAgent
from tests.support.sql import query
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

TWO_JOBS = """
from conveyor import push, workflow

ci = workflow("ci", on=[push(branches=["main"])])

@ci.job(runs_on=["{label}"], checkout=False)
def one(ctx):
    ctx.sh(["echo", "one"])

@ci.job(runs_on=["{label}"], checkout=False)
def two(ctx):
    ctx.sh(["echo", "two"])
"""

# An `event` scaler starts nothing itself: the test plays the provisioned machine, redeeming the claim
# the scaler emitted and registering with the token it answers.
SCALERS = {
    "version": 1,
    "scalers": [
        {
            "name": "cloud",
            "type": "event",
            "max_agents": 2,
            "provisioning_targets": ["acme/infra"],
            "provisioning_label": "provisioner",
            "label_sets": [{"labels": ["cloud"]}],
        }
    ],
}


def _claims_by_job(database_url: str, count: int) -> dict[str, str]:
    """Bound job id -> claim code of the `scale_up` events, once `count` were emitted (read from the
    table: every read surface redacts the code)."""

    def emitted() -> dict[str, str] | None:
        rows = query(database_url, "SELECT payload FROM events WHERE name = 'conveyor.scaler.scale_up'")
        payloads = [
            r["payload"] if isinstance(r["payload"], dict) else json.loads(r["payload"]) for r in rows
        ]
        found = {str(p_["bound_job_id"]): str(p_["claim_code"]) for p_ in payloads}
        return found if len(found) == count else None

    return wait_until(emitted, timeout=60, what=f"{count} scale_up events")


async def _claimed_agent(s: Stage, code: str) -> ScriptedAgent:
    """The provisioned machine's agent: redeem the claim, register with what it answers."""
    answer = HTTP.post(f"{s.server.url}/api/v1/agents/claim", json={"claim_code": code}, timeout=30)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    agent = ScriptedAgent(s.ws_url, body["token"], agent_id=body["agent_id"], labels=body["labels"])
    ack = await agent.connect()
    assert ack.agent_id == body["agent_id"]
    return agent


async def _dispatched(agent: ScriptedAgent) -> list[str]:
    """Job ids of every `job.dispatch` the agent was sent so far: a heartbeat round trip first, so a
    frame the orchestrator sent before its answer has been read."""
    if agent.close_code is None:
        await agent.send(p.Heartbeat(free_slots=agent.capacity))
        await agent.next_of(p.HeartbeatAck)
    return [m.job_id for m in agent.received if isinstance(m, p.JobDispatch)]


async def _run_one(agent: ScriptedAgent, dispatch: p.JobDispatch) -> None:
    await agent.accept(dispatch)
    await agent.wait_acked(await agent.finish(dispatch.job_id, "success"))


@contextmanager
def _spawned_run(
    tmp_path: Path, database_url: str
) -> Iterator[tuple[Stage, str, dict[str, str], dict[str, str]]]:
    """A server with the `event` scaler and the two `cloud` jobs pushed, once it asked for an agent for
    each: the stage, the run id, job id by job name and claim code by job id."""
    (tmp_path / "scalers.yaml").write_text(json.dumps(SCALERS))
    env = {**FAST, "CONVEYOR_SCALER_CONFIG": str(tmp_path / "scalers.yaml")}
    with stage(tmp_path, database_url, {"ci": TWO_JOBS.format(label="cloud")}, env=env) as s:
        run_id = s.push()
        jobs = {j["name"]: j["id"] for j in s.run(run_id)["jobs"]}
        yield s, run_id, jobs, _claims_by_job(database_url, 2)


async def test_an_ephemeral_agent_is_sent_one_job_while_it_runs_it_and_after(
    database_url: str, tmp_path: Path
) -> None:
    with stage(tmp_path, database_url, {"ci": TWO_JOBS.format(label="linux")}) as s:
        run_id = s.push()
        # Room for two, but single use: `conveyor agent --ephemeral` registers `ephemeral: true`.
        single = ScriptedAgent(s.ws_url, s.agent_token(["linux"]), capacity=2, ephemeral=True)
        await single.connect()
        first = await single.next_of(p.JobDispatch)
        await _run_one(single, first)
        other = ScriptedAgent(s.ws_url, s.agent_token(["linux"]))
        await other.connect()
        second = await other.next_of(p.JobDispatch)
        assert second.job_id != first.job_id
        await _run_one(other, second)
        s.wait_run(run_id, "success")
        assert await _dispatched(single) == [first.job_id]
        await single.close()
        await other.close()


async def test_a_claimed_spawn_agent_is_sent_its_bound_job_and_not_another_spawns(
    database_url: str, tmp_path: Path
) -> None:
    with _spawned_run(tmp_path, database_url) as (s, run_id, jobs, claims):
        assert set(claims) == set(jobs.values())
        first = await _claimed_agent(s, claims[jobs["one"]])
        dispatch = await first.next_of(p.JobDispatch)
        assert dispatch.job_id == jobs["one"]
        # Its job done, the first spawn's agent is still connected (a real one exits now) while job two,
        # bound to the second spawn, waits: it is not offered to the first.
        await _run_one(first, dispatch)
        second = await _claimed_agent(s, claims[jobs["two"]])
        other = await second.next_of(p.JobDispatch)
        assert other.job_id == jobs["two"]
        await _run_one(second, other)
        s.wait_run(run_id, "success")
        assert await _dispatched(first) == [jobs["one"]]
        assert await _dispatched(second) == [jobs["two"]]
        await first.close()
        await second.close()


async def test_a_claimed_spawn_agent_whose_job_was_cancelled_is_sent_nothing(
    database_url: str, tmp_path: Path
) -> None:
    with _spawned_run(tmp_path, database_url) as (s, run_id, jobs, claims):
        answer = s.api("POST", f"/runs/{run_id}/jobs/{jobs['one']}/cancel", json={})
        assert answer.status_code == 202, answer.text
        wait_until(lambda: s.job_status(run_id)["one"] == "cancelled", timeout=30, what="job one cancelled")
        # The first spawn registers after its job is gone: job two (bound to the second spawn) waits,
        # and this agent is the only one connected; it is sent nothing.
        first = await _claimed_agent(s, claims[jobs["one"]])
        second = await _claimed_agent(s, claims[jobs["two"]])
        dispatch = await second.next_of(p.JobDispatch)
        assert dispatch.job_id == jobs["two"]
        await _run_one(second, dispatch)
        wait_until(lambda: s.job_status(run_id)["two"] == "success", timeout=30, what="job two done")
        assert await _dispatched(first) == []
        await first.close()
        await second.close()
