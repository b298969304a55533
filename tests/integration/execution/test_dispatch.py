"""Dispatch through the real `/ws` endpoint with a scripted protocol client
(docs/design/execution.md §5–§8)."""

import time
from datetime import datetime
from pathlib import Path

import pytest

from conveyor.model import protocol as p
from tests.support.dispatch_stage import (
    GPU_WORKFLOW,
    NEEDS_WORKFLOW,
    SHORT_ACK_TIMEOUT,
    SINGLE_WORKFLOW,
    stage,
)
from tests.support.protocol_agent import ScriptedAgent
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow


async def test_needs_wait_and_a_failed_dependency_skips_all_but_always(
    database_url: str, tmp_path: Path
) -> None:
    with stage(tmp_path, database_url, {"ci": NEEDS_WORKFLOW}) as s:
        token = s.agent_token(["linux"])
        run_id = s.push()
        assert s.job_status(run_id) == {"build": "queued", "test": "pending", "report": "pending"}
        agent = ScriptedAgent(s.ws_url, token)
        await agent.connect()
        dispatch = await agent.next_of(p.JobDispatch)
        assert dispatch.job["name"] == "build"
        await agent.accept(dispatch)
        wait_until(lambda: s.job_status(run_id)["build"] == "running", what="build running", timeout=60)
        assert s.job_status(run_id)["test"] == "pending"
        await agent.wait_acked(await agent.step(dispatch.job_id, 1, "build", "failed", ["boom"]))
        await agent.wait_acked(await agent.finish(dispatch.job_id, "failed", "step_failed: build"))
        report = await agent.next_of(p.JobDispatch)
        assert report.job["name"] == "report"
        assert report.upstream["build"]["status"] == "failed"
        await agent.accept(report)
        await agent.wait_acked(await agent.finish(report.job_id, "success"))
        run = s.wait_run(run_id, "failed")
        statuses = {j["name"]: (j["status"], j["reason"]) for j in run["jobs"]}
        assert statuses["test"] == ("skipped", "needs: build failed")
        assert statuses["report"][0] == "success"
        await agent.close()


async def test_successful_dependency_releases_the_next_job_and_the_run_succeeds(
    database_url: str, tmp_path: Path
) -> None:
    with stage(tmp_path, database_url, {"ci": NEEDS_WORKFLOW}) as s:
        agent = ScriptedAgent(s.ws_url, s.agent_token(["linux"]), capacity=2)
        run_id = s.push()
        await agent.connect()
        build = await agent.next_of(p.JobDispatch)
        await agent.accept(build)
        await agent.wait_acked(await agent.finish(build.job_id, "success"))
        released = {(await agent.next_of(p.JobDispatch)).job["name"] for _ in range(2)}
        assert released == {"test", "report"}
        for dispatch in [
            m for m in agent.received if isinstance(m, p.JobDispatch) and m.job["name"] != "build"
        ]:
            await agent.accept(dispatch)
            await agent.wait_acked(await agent.finish(dispatch.job_id, "success"))
        s.wait_run(run_id, "success")
        # A replay of an applied terminal status is acknowledged without another transition.
        oseq = await agent.finish(build.job_id, "failed", oseq=999)
        await agent.wait_acked(oseq)
        assert s.run(run_id)["status"] == "success"
        await agent.close()


async def test_an_agent_that_never_acks_loses_the_job_until_attempts_run_out(
    database_url: str, tmp_path: Path
) -> None:
    # The silent agent sends no heartbeat: a long dead-after keeps a slow dispatch from being
    # overtaken by the dead-agent close (4004) before the ack deadline (4031) it is about.
    env = {
        "CONVEYOR_DISPATCH_MAX_ATTEMPTS": "2",
        "CONVEYOR_AGENT_DEAD_AFTER_MS": "120000",
        **SHORT_ACK_TIMEOUT,
    }
    with stage(tmp_path, database_url, {"ci": SINGLE_WORKFLOW}, env) as s:
        token = s.agent_token(["linux"])
        run_id = s.push()
        for attempt in (1, 2):
            agent = ScriptedAgent(s.ws_url, token, agent_id="silent")
            await agent.connect()
            dispatch = await agent.next_of(p.JobDispatch)
            assert dispatch.attempt == attempt
            assert await agent.wait_closed() == p.CLOSE_ACK_TIMEOUT
        run = s.wait_run(run_id, "failed")
        build = next(j for j in run["jobs"] if j["name"] == "build")
        assert (build["status"], build["reason"]) == ("failed", "dispatch_attempts_exhausted")


async def test_cancelling_a_run_cancels_queued_and_running_jobs(database_url: str, tmp_path: Path) -> None:
    with stage(tmp_path, database_url, {"ci": NEEDS_WORKFLOW}) as s:
        agent = ScriptedAgent(s.ws_url, s.agent_token(["linux"]))
        run_id = s.push()
        await agent.connect()
        build = await agent.next_of(p.JobDispatch)
        await agent.accept(build)
        wait_until(lambda: s.job_status(run_id)["build"] == "running", what="build running", timeout=60)
        answer = s.api("POST", f"/runs/{run_id}/cancel", json={"reason": "test"})
        assert answer.status_code == 202 and answer.json() == {"cancelled": 2, "signalled": 1}
        cancel = await agent.next_of(p.JobCancel)
        assert cancel.job_id == build.job_id
        await agent.wait_acked(await agent.finish(build.job_id, "cancelled", "cancelled_by"))
        run = s.wait_run(run_id, "cancelled")
        assert {j["status"] for j in run["jobs"]} == {"cancelled"}
        again = s.api("POST", f"/runs/{run_id}/cancel")
        assert again.status_code == 409 and again.json()["error"] == "run_finished"
        await agent.close()


async def test_a_lost_agent_keeps_its_job_if_it_returns_within_the_grace(
    database_url: str, tmp_path: Path
) -> None:
    with stage(tmp_path, database_url, {"ci": NEEDS_WORKFLOW}) as s:
        token = s.agent_token(["linux"])
        run_id = s.push()
        agent = ScriptedAgent(s.ws_url, token, agent_id="flaky")
        await agent.connect()
        build = await agent.next_of(p.JobDispatch)
        await agent.accept(build)
        wait_until(lambda: s.job_status(run_id)["build"] == "running", what="build running", timeout=60)
        await agent.close()
        wait_until(lambda: s.job_status(run_id)["build"] == "recovering", what="build recovering", timeout=60)
        back = ScriptedAgent(s.ws_url, token, agent_id="flaky")
        await back.connect(in_flight=[build.job_id])
        wait_until(lambda: s.job_status(run_id)["build"] == "running", what="build running again", timeout=60)
        await back.wait_acked(await back.finish(build.job_id, "success"))
        wait_until(lambda: s.job_status(run_id)["build"] == "success", what="build success", timeout=60)
        await back.close()


async def test_a_lost_agent_that_never_returns_fails_its_job_after_the_grace(
    database_url: str, tmp_path: Path
) -> None:
    with stage(tmp_path, database_url, {"ci": SINGLE_WORKFLOW}) as s:
        run_id = s.push()
        agent = ScriptedAgent(s.ws_url, s.agent_token(["linux"]))
        await agent.connect()
        build = await agent.next_of(p.JobDispatch)
        await agent.accept(build)
        wait_until(lambda: s.job_status(run_id)["build"] == "running", what="build running", timeout=60)
        await agent.close()
        run = s.wait_run(run_id, "failed")
        build_row = next(j for j in run["jobs"] if j["name"] == "build")
        assert (build_row["status"], build_row["reason"]) == ("failed", "agent_lost")


async def test_unservable_labels_are_shown_then_fail_unroutable(database_url: str, tmp_path: Path) -> None:
    with stage(tmp_path, database_url, {"ml": GPU_WORKFLOW}, {"CONVEYOR_UNROUTABLE_GRACE_MS": "2500"}) as s:
        agent = ScriptedAgent(s.ws_url, s.agent_token(["linux"]))
        await agent.connect()
        run_id = s.push()

        def unschedulable() -> str | None:
            items = s.api("GET", "/queue").json()["items"]
            text = next((str(i.get("unschedulable") or i.get("reason") or "") for i in items), "")
            return text if text.startswith("unschedulable") else None

        note = wait_until(unschedulable, timeout=10, what="the unschedulable note")
        assert "gpu" in note and "linux" in note
        run = s.wait_run(run_id, "failed")
        assert run["jobs"][0]["reason"].startswith("unroutable: ")
        await agent.close()


async def test_a_malformed_frame_closes_4000_after_the_frames_before_it_are_applied(
    database_url: str, tmp_path: Path
) -> None:
    with stage(tmp_path, database_url, {"ci": SINGLE_WORKFLOW}) as s:
        agent = ScriptedAgent(s.ws_url, s.agent_token(["linux"]))
        await agent.connect()
        run_id = s.push()
        dispatch = await agent.next_of(p.JobDispatch)
        await agent.accept(dispatch)
        await agent.finish(dispatch.job_id, "success")
        await agent.send_raw({"type": "job.finished", "job_id": dispatch.job_id})  # no oseq, no status
        assert await agent.wait_closed() == p.CLOSE_BAD_MESSAGE
        assert s.wait_run(run_id, "success")["jobs"][0]["status"] == "success"


async def test_start_times_are_the_agents_when_plausible_else_the_moment_of_reading(
    database_url: str, tmp_path: Path
) -> None:
    with stage(tmp_path, database_url, {"ci": SINGLE_WORKFLOW}) as s:
        agent = ScriptedAgent(s.ws_url, s.agent_token(["linux"]))
        run_id = s.push()
        await agent.connect()
        dispatch = await agent.next_of(p.JobDispatch)
        now_ms = time.time() * 1000
        await agent.send(p.JobAck(re=dispatch.id, job_id=dispatch.job_id))
        await agent.send(p.JobStarted(job_id=dispatch.job_id, ts=now_ms - 3000))  # started 3 s ago
        for index, ts in ((0, now_ms - 2000), (1, now_ms + 3_600_000), (2, now_ms - 3_600_000)):
            await agent.send(p.StepStarted(job_id=dispatch.job_id, step_index=index, name=f"s{index}", ts=ts))
        await agent.wait_acked(await agent.finish(dispatch.job_id, "success"))
        s.wait_run(run_id, "success")
        [job] = s.api("GET", f"/runs/{run_id}/jobs").json()["items"]
        read_at = time.time() * 1000

        def ms(value: str) -> float:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() * 1000

        assert abs(ms(job["started_at"]) - (now_ms - 3000)) < 2, "the agent's plausible stamp"
        steps = {step["name"]: ms(step["started_at"]) for step in job["steps"]}
        assert abs(steps["s0"] - (now_ms - 2000)) < 2
        assert now_ms - 1000 < steps["s1"] <= read_at, "a stamp ahead of the orchestrator: the reading time"
        assert now_ms - 1000 < steps["s2"] <= read_at, "an implausibly old stamp: the reading time"
        await agent.close()
