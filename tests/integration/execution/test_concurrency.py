"""Concurrency groups, `max_parallel` and `fail_fast` through a real server
(docs/design/execution.md §8.1, §8.3)."""

from pathlib import Path

import pytest

from conveyor.model import protocol as p
from tests.support.concurrency import DEPLOY, QUEUEING
from tests.support.dispatch_stage import Stage, stage
from tests.support.protocol_agent import ScriptedAgent
from tests.support.repos import git, make_repo
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

SUPERSEDING = """
from conveyor import Concurrency, push, workflow

ci = workflow("ci", on=[push(branches=["main"])],
              concurrency=Concurrency("ci-{event.branch}", cancel_in_progress=True))

@ci.job(runs_on=["linux"])
def build(ctx):
    ctx.sh(["echo", "build"])
"""


MATRIX = """
from conveyor import push, workflow

ci = workflow("ci", on=[push(branches=["main"])])

@ci.job(runs_on=["linux"], matrix={"py": ["3.10", "3.11", "3.12"]}, max_parallel=1, fail_fast=True)
def test(ctx):
    ctx.sh(["echo", "test"])

@ci.job(runs_on=["linux"], needs=[test])
def publish(ctx):
    ctx.sh(["echo", "publish"])
"""


def jobs_of(s: Stage, run_id: str) -> dict[str, tuple[str, str | None]]:
    return {j["display_name"]: (j["status"], j["reason"]) for j in s.run(run_id)["jobs"]}


async def test_cancel_in_progress_supersedes_the_older_run(database_url: str, tmp_path: Path) -> None:
    with stage(tmp_path, database_url, {"ci": SUPERSEDING}) as s:
        agent = ScriptedAgent(s.ws_url, s.agent_token(["linux"]))
        await agent.connect()
        first = s.push()
        older = await agent.next_of(p.JobDispatch)
        assert older.run_id == first
        await agent.accept(older)
        wait_until(lambda: s.job_status(first)["build"] == "running", what="first build running", timeout=60)
        second = s.push()
        # The newer run starts; the older one's running job is told to stop.
        assert s.run(second)["status"] == "queued"
        cancel = await agent.next_of(p.JobCancel)
        assert cancel.job_id == older.job_id and cancel.reason == f"superseded: run {second}"
        await agent.wait_acked(await agent.finish(older.job_id, "cancelled", cancel.reason))
        # Answered before the blocking API calls below (see the next test).
        newer = await agent.next_of(p.JobDispatch)
        await agent.accept(newer)
        assert newer.run_id == second
        run = s.wait_run(first, "cancelled")
        assert run["reason"] == f"superseded: run {second}"
        await agent.wait_acked(await agent.finish(newer.job_id, "success"))
        s.wait_run(second, "success")
        await agent.close()


async def test_without_cancel_in_progress_the_newer_run_waits_for_the_older(
    database_url: str, tmp_path: Path
) -> None:
    with stage(tmp_path, database_url, {"ci": QUEUEING}) as s:
        agent = ScriptedAgent(s.ws_url, s.agent_token(["linux"]), capacity=2)
        await agent.connect()
        first = s.push()
        older = await agent.next_of(p.JobDispatch)
        await agent.accept(older)
        second = s.push()
        waiting = s.run(second)
        assert (waiting["status"], waiting["reason"]) == ("pending", "waiting: concurrency group ci-main")
        assert jobs_of(s, second)["build"] == ("pending", "waiting: the run's concurrency group")
        # The agent has a free slot, yet nothing of the waiting run reaches it.
        assert [i for i in s.api("GET", "/queue").json()["items"] if i["run_id"] == second] == []
        await agent.wait_acked(await agent.finish(older.job_id, "success"))
        # Answer the dispatch before any blocking API call: the test's HTTP calls hold the event loop the
        # scripted agent acks from, and a late ack is an ack timeout (4031), not what this test is about.
        newer = await agent.next_of(p.JobDispatch)
        await agent.accept(newer)
        assert newer.run_id == second
        s.wait_run(first, "success")
        assert s.run(second)["reason"] is None
        await agent.wait_acked(await agent.finish(newer.job_id, "success"))
        s.wait_run(second, "success")
        await agent.close()


def add_second_repo(s: Stage, tmp_path: Path, workflows: dict[str, str]) -> tuple[str, Path]:
    repo = make_repo(tmp_path / "other", workflows)
    answer = s.api("POST", "/sources", json={"kind": "local", "name": "other", "path": str(repo)})
    assert answer.status_code == 201, answer.text
    return answer.json()["id"], repo


def push_source(s: Stage, source_id: str, repo: Path) -> str:
    answer = s.api(
        "POST",
        f"/sources/{source_id}/trigger",
        json={"ref": "refs/heads/main", "sha": git(repo, "rev-parse", "HEAD")},
    )
    assert answer.status_code == 202, answer.text
    delivery = answer.json()["delivery"]
    return wait_until(
        lambda: s.api("GET", f"/deliveries/{delivery}").json()["runs"], timeout=20, what="the run"
    )[0]


async def test_a_job_group_spans_repositories_one_job_at_a_time(database_url: str, tmp_path: Path) -> None:
    with stage(tmp_path, database_url, {"ship": DEPLOY}) as s:
        other_source, other_repo = add_second_repo(s, tmp_path, {"ship": DEPLOY})
        agent = ScriptedAgent(s.ws_url, s.agent_token(["linux"]), capacity=2)
        await agent.connect()
        first = s.push()
        holder = await agent.next_of(p.JobDispatch)
        await agent.accept(holder)
        second = push_source(s, other_source, other_repo)
        assert s.run(second)["status"] == "queued"
        assert jobs_of(s, second)["deploy"] == ("pending", "waiting: concurrency group production")
        await agent.wait_acked(await agent.finish(holder.job_id, "success"))
        s.wait_run(first, "success")
        follower = await agent.next_of(p.JobDispatch)
        assert follower.run_id == second
        await agent.accept(follower)
        await agent.wait_acked(await agent.finish(follower.job_id, "success"))
        s.wait_run(second, "success")
        await agent.close()


async def test_max_parallel_releases_one_combination_at_a_time_and_fail_fast_cancels_the_rest(
    database_url: str, tmp_path: Path
) -> None:
    with stage(tmp_path, database_url, {"ci": MATRIX}) as s:
        agent = ScriptedAgent(s.ws_url, s.agent_token(["linux"]), capacity=3)
        run_id = s.push()
        statuses = jobs_of(s, run_id)
        assert sorted(status for status, _ in statuses.values()) == [
            "pending",
            "pending",
            "pending",
            "queued",
        ]
        assert statuses["test (3.11)"] == ("pending", "waiting: max_parallel")
        await agent.connect()
        first = await agent.next_of(p.JobDispatch)
        await agent.accept(first)
        await agent.wait_acked(await agent.finish(first.job_id, "success"))
        second = await agent.next_of(p.JobDispatch)
        assert second.job["name"] == "test" and second.job_id != first.job_id
        await agent.accept(second)
        await agent.wait_acked(await agent.finish(second.job_id, "failed", "step_failed: test"))
        run = s.wait_run(run_id, "failed")
        by_reason = sorted((j["status"], j["reason"]) for j in run["jobs"])
        assert by_reason == [
            ("cancelled", "fail_fast"),
            ("failed", "step_failed: test"),
            ("skipped", "needs: test failed"),
            ("success", None),
        ]
        await agent.close()
