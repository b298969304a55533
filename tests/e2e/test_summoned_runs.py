"""End to end (docs/design/execution.md §8.6): a step's `ctx.summon` on real agents starts a run of another
workflow's `dispatch` trigger, waits for it and gets its outputs; cancelling the summoner cancels it; the chain
depth and the trust rules refuse a summon with a clear reason."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.agents import agent_process, job_log
from tests.support.dispatch_stage import Stage, stage
from tests.support.processes import run_cli
from tests.support.repos import make_repo
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

# `deploy` is started only by a dispatch; its step's outputs are the run's outputs.
DEPLOY = """
from conveyor import Input, dispatch, workflow

deploy = workflow("deploy", on=[dispatch(inputs={"version": Input(str, required=True)})])

ship = deploy.job("ship", runs_on=["linux"])


@ship.step(outputs={"url": str})
def publish(ctx):
    return {"url": "https://example.test/" + ctx.inputs["version"]}
"""

SUMMONER = """
import json

from conveyor import SummonError, push, workflow

ci = workflow("ci", on=[push(branches=["main"])])


@ci.job(runs_on=["linux"])
def release(ctx):
    try:
        run = ctx.summon("deploy", {"version": "1.2.3"}, timeout=240)
    except SummonError as error:
        print("REFUSED=" + json.dumps({"code": error.code, "detail": error.detail}))
        raise
    print("SUMMONED=" + json.dumps({"id": run.id, "status": run.status, "outputs": run.outputs}))
"""

# The summoned run sleeps until it is cancelled.
SLEEPER = """
from conveyor import dispatch, workflow

slow = workflow("slow", on=[dispatch()])


@slow.job(runs_on=["linux"])
def sleep(ctx):
    ctx.sh("sleep 600")
"""

WAITER = """
from conveyor import push, workflow

ci = workflow("ci", on=[push(branches=["main"])])


@ci.job(runs_on=["linux"])
def wait_for_it(ctx):
    ctx.summon("slow", timeout=600)
"""

CROSS = """
import json

from conveyor import SummonError, push, workflow

ci = workflow("ci", on=[push(branches=["main"])])


@ci.job(runs_on=["linux"])
def release(ctx):
    try:
        run = ctx.summon("deploy", {"version": "9.9"}, repo="local:other", timeout=240)
    except SummonError as error:
        print("REFUSED=" + json.dumps({"code": error.code, "detail": error.detail}))
        raise
    print("SUMMONED=" + json.dumps({"id": run.id, "status": run.status, "outputs": run.outputs}))
"""


@contextmanager
def two_agents(s: Stage, tmp_path: Path) -> Iterator[None]:
    """A waiting summoner holds its agent: the summoned run needs another."""
    with ExitStack() as stack:
        for name in ("agent-a", "agent-b"):
            (tmp_path / name).mkdir()
            stack.enter_context(agent_process(s, tmp_path / name / "home"))
        yield


def marked(s: Stage, run_id: str, mark: str) -> dict[str, Any]:
    """The JSON a step printed after `MARK=` in the run's first job's log."""
    job = s.run(run_id)["jobs"][0]
    text = job_log(s, run_id, job["id"])
    line = next(line for line in text.splitlines() if line.startswith(mark + "="))
    return json.loads(line.split("=", 1)[1])  # type: ignore[no-any-return]


def test_a_summon_with_wait_returns_the_summoned_runs_outputs_and_both_runs_link(
    database_url: str, tmp_path: Path
) -> None:
    with stage(tmp_path, database_url, {"ci": SUMMONER, "deploy": DEPLOY}) as s:
        with two_agents(s, tmp_path):
            parent_id = s.push()
            parent = s.wait_run(parent_id, "success", timeout=180)
        seen = marked(s, parent_id, "SUMMONED")
        assert seen["status"] == "success"
        assert seen["outputs"] == {"ship": {"publish": {"url": "https://example.test/1.2.3"}}}
        child = s.run(seen["id"])
        assert child["workflow"] == "deploy" and child["status"] == "success"
        assert child["summoned_by_run_id"] == parent_id and child["chain_depth"] == 1
        assert child["summoned_by"]["run_id"] == parent_id
        assert child["summoned_by"]["job_id"] == parent["jobs"][0]["id"]
        assert child["event"]["payload"]["inputs"] == {"version": "1.2.3"}
        assert child["sha"] == parent["sha"]  # a summon into its own source runs at the summoner's commit
        assert [c["run_id"] for c in s.run(parent_id)["summoned"]] == [seen["id"]]
        shown = run_cli(
            ["admin", "run", "show", parent_id],
            env={"CONVEYOR_URL": s.server.url, "CONVEYOR_TOKEN": s.token},
        )
        assert f"summoned: run {seen['id']} (deploy #1) success by job release" in shown.stdout
        shown = run_cli(
            ["admin", "run", "show", seen["id"]],
            env={"CONVEYOR_URL": s.server.url, "CONVEYOR_TOKEN": s.token},
        )
        assert f"summoned by: run {parent_id} (ci #1)" in shown.stdout
        # The dashboard's run pages link both ways too.
        with httpx.Client(base_url=s.server.url, timeout=30) as browser:
            signed = browser.post("/ui/sign-in", data={"token": s.token, "next": "/ui/runs"})
            assert signed.status_code == 303, signed.text
            page = browser.get(f"/ui/runs/{parent_id}").text
            assert f'<a href="/ui/runs/{seen["id"]}" data-summoned="{seen["id"]}">deploy #1</a>' in page
            page = browser.get(f"/ui/runs/{seen['id']}").text
            assert f'data-summoned-by="{parent_id}">ci #1</a>' in page


def test_cancelling_the_summoning_run_cancels_the_summoned_run(database_url: str, tmp_path: Path) -> None:
    with stage(tmp_path, database_url, {"ci": WAITER, "slow": SLEEPER}) as s:
        with two_agents(s, tmp_path):
            parent_id = s.push()

            def summoned_running() -> str | None:
                children = s.run(parent_id)["summoned"]
                if children and s.run(children[0]["run_id"])["status"] == "running":
                    return str(children[0]["run_id"])
                return None

            child_id = wait_until(summoned_running, timeout=120, what="the summoned run running")
            answer = s.api("POST", f"/runs/{parent_id}/cancel", json={})
            assert answer.status_code == 202, answer.text
            s.wait_run(parent_id, "cancelled", timeout=120)
            child = s.wait_run(child_id, "cancelled", timeout=120)
        parent_job = s.run(parent_id)["jobs"][0]["id"]
        assert all(j["status"] == "cancelled" for j in child["jobs"])
        assert any(f"summoner_ended: job {parent_job}" in (j["reason"] or "") for j in child["jobs"])


def test_a_summon_beyond_the_chain_depth_fails_with_a_clear_reason(database_url: str, tmp_path: Path) -> None:
    env = {"CONVEYOR_EVENTS_MAX_CHAIN_DEPTH": "1"}
    with stage(tmp_path, database_url, {"ci": SUMMONER, "deploy": DEPLOY}, env=env) as s:
        with agent_process(s, tmp_path / "agent-home"):
            parent_id = s.push()
            s.wait_run(parent_id, "failed", timeout=120)
        refused = marked(s, parent_id, "REFUSED")
        assert refused["code"] == "chain_depth_exceeded"
        assert "chain depth 1 reaches the limit of 1" in refused["detail"]
        assert s.run(parent_id)["summoned"] == []
        runs = s.api("GET", "/runs", params={"workflow": "deploy"}).json()["items"]
        assert runs == []


def test_a_summon_into_an_untrusted_repository_is_refused_until_a_grant_names_it(
    database_url: str, tmp_path: Path
) -> None:
    other = make_repo(tmp_path / "other", {"deploy": DEPLOY})
    with stage(tmp_path, database_url, {"ci": CROSS}) as s:
        answer = s.api("POST", "/sources", json={"kind": "local", "name": "other", "path": str(other)})
        assert answer.status_code == 201, answer.text
        # A grant of every event name lets events through, never summons.
        events_only = {
            "source_routing_key": "local:app",
            "target_routing_key": "local:other",
            "target_repo": "other",
            "event_names": ["*"],
        }
        assert s.api("POST", "/event-trust", json=events_only).status_code == 201
        with two_agents(s, tmp_path):
            refused_id = s.push()
            s.wait_run(refused_id, "failed", timeout=120)
            refused = marked(s, refused_id, "REFUSED")
            assert refused["code"] == "untrusted"
            assert (
                "no event trust grant from local:app to local:other names summon:deploy" in refused["detail"]
            )
            assert s.api("GET", "/runs", params={"workflow": "deploy"}).json()["items"] == []

            summons = {
                "source_routing_key": "local:app",
                "source_repo": "*",
                "target_routing_key": "local:other",
                "target_repo": "*",
                "event_names": ["summon:deploy"],
            }
            answer = s.api("POST", "/event-trust", json=summons)
            assert answer.status_code == 201, answer.text
            allowed_id = s.push()
            s.wait_run(allowed_id, "success", timeout=180)
        seen = marked(s, allowed_id, "SUMMONED")
        assert seen["outputs"] == {"ship": {"publish": {"url": "https://example.test/9.9"}}}
        child = s.run(seen["id"])
        assert child["routing_key"] == "local:other" and child["summoned_by_run_id"] == allowed_id
