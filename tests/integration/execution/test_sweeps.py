"""The leader sweep's stale detection and expiry through a real server
(docs/design/execution.md §5, §8.3, §8.4)."""

from pathlib import Path

import pytest

from conveyor.model import protocol as p
from tests.support.concurrency import DEPLOY, QUEUEING
from tests.support.dispatch_stage import FAST, SILENT_AGENT_DEAD_AFTER, SINGLE_WORKFLOW, stage
from tests.support.processes import ServerProcess
from tests.support.protocol_agent import ScriptedAgent
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow


async def test_a_running_job_whose_agent_is_connected_nowhere_recovers_then_fails_agent_lost(
    database_url: str, tmp_path: Path
) -> None:
    with stage(tmp_path, database_url, {"ci": SINGLE_WORKFLOW}) as s:
        agent = ScriptedAgent(s.ws_url, s.agent_token(["linux"]))
        run_id = s.push()
        await agent.connect()
        dispatch = await agent.next_of(p.JobDispatch)
        await agent.accept(dispatch)
        wait_until(lambda: s.job_status(run_id)["build"] == "running", what="build running", timeout=60)
        # The coordinator dies with the connection; the one that comes back never hears from the agent.
        s.server.kill()
        await agent.close()
        restarted = ServerProcess(
            tmp_path / "home", database_url=database_url, env={**FAST, **SILENT_AGENT_DEAD_AFTER}
        )
        try:
            restarted.wait_ready()
            s.server = restarted
            # Its heartbeats stopped (SILENT_AGENT_DEAD_AFTER): recovering with a full grace…
            wait_until(lambda: s.job_status(run_id)["build"] == "recovering", what="recovering", timeout=60)
            # …then failed, agent_lost (CONVEYOR_RECOVERY_GRACE_MS=1500).
            run = s.wait_run(run_id, "failed", timeout=60)
            assert (run["jobs"][0]["status"], run["jobs"][0]["reason"]) == ("failed", "agent_lost")
        finally:
            restarted.stop()


async def test_a_queued_job_past_its_queue_timeout_times_out(database_url: str, tmp_path: Path) -> None:
    # The blocking waits below starve the scripted agent's heartbeats: keep it from being closed 4004.
    env = {"CONVEYOR_QUEUE_TIMEOUT_MS": "2000", "CONVEYOR_AGENT_DEAD_AFTER_MS": "120000"}
    with stage(tmp_path, database_url, {"ci": SINGLE_WORKFLOW}, env) as s:
        agent = ScriptedAgent(s.ws_url, s.agent_token(["linux"]))
        await agent.connect()
        first = s.push()
        held = await agent.next_of(p.JobDispatch)
        await agent.accept(held)  # the only matching agent stays busy
        # Not observed while queued: on a loaded machine the row can expire (2 s) before a poll sees it.
        second = s.push()
        run = s.wait_run(second, "failed", timeout=60)
        job = run["jobs"][0]
        assert (job["status"], job["reason"]) == (
            "timed_out",
            "queue_timeout: waiting: 1 matching agent busy",
        )
        # The held job is untouched by the expiry.
        assert s.job_status(first)["build"] == "running"
        await agent.wait_acked(await agent.finish(held.job_id, "success"))
        s.wait_run(first, "success")
        await agent.close()


async def test_waiting_for_a_group_past_the_wait_timeout_fails_the_run_or_times_out_the_job(
    database_url: str, tmp_path: Path
) -> None:
    env = {"CONVEYOR_CONCURRENCY_WAIT_TIMEOUT_MS": "1500", "CONVEYOR_AGENT_DEAD_AFTER_MS": "120000"}
    with stage(tmp_path, database_url, {"ci": QUEUEING, "ship": DEPLOY}, env) as s:
        agent = ScriptedAgent(s.ws_url, s.agent_token(["linux"]), capacity=2)
        await agent.connect()
        s.push()  # one run of each workflow, both jobs taken by the agent
        for _ in range(2):
            await agent.accept(await agent.next_of(p.JobDispatch))

        def all_runs() -> dict[str, dict[str, str]]:
            return {r["id"]: r for r in s.api("GET", "/runs").json()["items"]}

        holders = wait_until(
            lambda: (runs := all_runs()) and {r["status"] for r in runs.values()} == {"running"} and runs,
            timeout=60,
            what="both first runs running",
        )
        s.push()
        fresh = wait_until(
            lambda: len(runs := all_runs()) == 4 and {i: r for i, r in runs.items() if i not in holders},
            timeout=60,
            what="the second push's runs",
        )
        waiting = {r["workflow"]: run_id for run_id, r in fresh.items()}
        ci_run = s.wait_run(waiting["ci"], "failed", timeout=60)
        assert ci_run["reason"] == "concurrency_wait_timeout"
        assert [(j["status"], j["reason"]) for j in ci_run["jobs"]] == [
            ("cancelled", "concurrency_wait_timeout")
        ]
        ship_run = s.wait_run(waiting["ship"], "failed", timeout=60)
        assert [(j["status"], j["reason"]) for j in ship_run["jobs"]] == [
            ("timed_out", "concurrency_wait_timeout")
        ]
        assert {s.run(run_id)["status"] for run_id in holders} == {"running"}
        await agent.close()


@pytest.mark.postgres_only
async def test_the_leader_recovers_jobs_of_agents_whose_coordinator_died(
    postgres_url: str, tmp_path: Path
) -> None:
    """Coordinator B dies with its agent's job running; the jobs are recovered from A's side."""
    from tests.support.dispatch_stage import Stage
    from tests.support.repos import make_repo

    repo = make_repo(tmp_path / "repo", {"ci": SINGLE_WORKFLOW})
    env = {**FAST, "CONVEYOR_SECRET_KEY": "2d" * 32, "CONVEYOR_CLUSTER_LEASE_TTL_MS": "3000"}
    # A (the leader, started first) judges the silent job; B hosts the agent through blocking waits.
    node_a = ServerProcess(
        tmp_path / "a",
        database_url=postgres_url,
        env={**env, **SILENT_AGENT_DEAD_AFTER, "CONVEYOR_INSTANCE_ID": "node-a"},
    )
    node_a.wait_ready()
    node_b = ServerProcess(
        tmp_path / "b", database_url=postgres_url, env={**env, "CONVEYOR_INSTANCE_ID": "node-b"}
    )
    try:
        node_b.wait_ready()
        a = Stage(node_a, repo)
        a.add_source()
        agent = ScriptedAgent(node_b.url.replace("http://", "ws://") + "/ws", a.agent_token(["linux"]))
        await agent.connect()
        run_id = a.push()
        dispatch = await agent.next_of(p.JobDispatch)
        await agent.accept(dispatch)
        wait_until(lambda: a.job_status(run_id)["build"] == "running", what="build running on B", timeout=60)
        node_b.kill()
        await agent.close()
        # B's agent row still says online on B; once B's instance row is stale and the job silent
        # past A's SILENT_AGENT_DEAD_AFTER, the leader (A) recovers it, then fails it agent_lost.
        wait_until(lambda: a.job_status(run_id)["build"] == "recovering", what="recovering", timeout=60)
        run = a.wait_run(run_id, "failed", timeout=60)
        assert (run["jobs"][0]["status"], run["jobs"][0]["reason"]) == ("failed", "agent_lost")
    finally:
        node_b.stop()
        node_a.stop()
