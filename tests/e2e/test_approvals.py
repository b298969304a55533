"""End to end: a push whose deploy job targets a protected environment, a real agent, and approvals through
the CLI and the API (docs/design/approvals.md §7), on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.agents import agent_process, job_log
from tests.support.dispatch_stage import FAST, Stage, stage
from tests.support.processes import ServerProcess, run_cli
from tests.support.sql import query
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

SECRET = "prod-deploy-key-7c1f"

# `deploy` proves it got the environment's secret by succeeding: a wrong or missing value fails it.
WORKFLOWS = {
    "ship": f"""
from conveyor import push, workflow

ship = workflow("ship", on=[push(branches=["main"])])

@ship.job(runs_on=["linux"])
def build(ctx):
    ctx.sh(["echo", "built"])

@ship.job(runs_on=["linux"], needs=[build], environment="production")
def deploy(ctx):
    key = ctx.secrets.get("DEPLOY_KEY")
    if key != "{SECRET}":
        raise SystemExit("wrong deploy key")
    ctx.sh(["echo", "deployed with", key])

@ship.job(runs_on=["linux"], needs=[deploy])
def announce(ctx):
    ctx.sh(["echo", "announced"])
""",
}


def protect_production(s: Stage, approvers: list[str]) -> None:
    assert s.api("PUT", "/environments/production", json={}).status_code in (200, 201)
    answer = s.api("PUT", "/secrets/env%2Fproduction/DEPLOY_KEY", json={"value": SECRET})
    assert answer.status_code in (200, 201), answer.text
    answer = s.api("PUT", "/environments/production/protection", json={"approvers": approvers})
    assert answer.status_code == 200, answer.text


def token(s: Stage, role: str, label: str) -> str:
    answer = s.api("POST", "/tokens", json={"role": role, "label": label})
    assert answer.status_code == 201, answer.text
    return str(answer.json()["token"])


def jobs_of(s: Stage, run_id: str) -> dict[str, dict[str, Any]]:
    return {j["name"]: j for j in s.run(run_id)["jobs"]}


def wait_job(s: Stage, run_id: str, name: str, status: str, timeout: float = 120) -> dict[str, Any]:
    return wait_until(
        lambda: (job := jobs_of(s, run_id)[name])["status"] == status and job,
        timeout=timeout,
        what=f"{name} {status}",
    )


def cli(s: Stage, as_token: str, *args: str) -> Any:
    return run_cli(["admin", *args], env={"CONVEYOR_URL": s.server.url, "CONVEYOR_TOKEN": as_token})


def test_an_approved_deploy_runs_with_the_environments_secret_and_a_rejected_one_skips_its_dependant(
    database_url: str, tmp_path: Path
) -> None:
    with stage(tmp_path, database_url, WORKFLOWS) as s:
        protect_production(s, ["release-manager"])
        manager = token(s, "admin", "release-manager")
        auditor = token(s, "auditor", "reader")
        operator = token(s, "operator", "on-call")
        with agent_process(s, tmp_path / "agent-home"):
            run_id = s.push()
            deploy = wait_job(s, run_id, "deploy", "waiting_approval")
            assert (
                deploy["reason"]
                == "waiting: approval for environment production (approvers: release-manager)"
            )
            assert jobs_of(s, run_id)["build"]["status"] == "success"
            assert all(i["job_id"] != deploy["id"] for i in s.api("GET", "/queue").json()["items"])
            requested = s.api("GET", "/events", params={"name": "conveyor.approval.requested"}).json()[
                "items"
            ]
            assert [e["source_run_id"] for e in requested] == [run_id]

            # No run.approve: 403 naming it; the wrong approver: 403 not_an_approver. Neither changes the job.
            refused = cli(s, auditor, "run", "approve", run_id)
            assert refused.returncode == 3, refused.stderr
            assert "run.approve" in refused.stderr and "Traceback" not in refused.stderr
            outsider = cli(s, operator, "run", "approve", run_id, "--job", "deploy")
            assert outsider.returncode == 3 and "not_an_approver" in outsider.stderr, outsider.stderr
            assert "Traceback" not in outsider.stderr
            assert jobs_of(s, run_id)["deploy"]["status"] == "waiting_approval"

            approved = cli(s, manager, "run", "approve", run_id, "--comment", "change 42")
            assert approved.returncode == 0, approved.stderr
            assert "deploy: approved" in approved.stdout
            run = s.wait_run(run_id, "success", timeout=120)
            assert {j["name"]: j["status"] for j in run["jobs"]} == {
                "build": "success",
                "deploy": "success",
                "announce": "success",
            }
            deployed = next(j for j in run["jobs"] if j["name"] == "deploy")
            assert deployed["approval"]["comment"] == "change 42"
            assert "deployed with ***" in job_log(s, run_id, deployed["id"])
            logged = s.api("GET", "/access-log", params={"action": "runs.approve_job"}).json()["items"]
            # The approval, and both refusals (the auditor's by the guard, the operator's by the rule).
            assert [(r["outcome"], r["target_id"]) for r in logged if r["outcome"] == "allowed"] == [
                ("allowed", deployed["id"])
            ]
            assert sorted(r["actor_role"] for r in logged if r["outcome"] == "denied") == [
                "auditor",
                "operator",
            ]

            second = push_again(s)
            wait_job(s, second, "deploy", "waiting_approval")
            rejected = cli(s, manager, "run", "reject", second, "--comment", "freeze week")
            assert rejected.returncode == 0, rejected.stderr
            run = s.wait_run(second, "failed", timeout=120)
            ended = {j["name"]: (j["status"], j["reason"]) for j in run["jobs"]}
            assert ended["deploy"] == ("failed", "rejected: release-manager: freeze week")
            assert ended["announce"] == ("skipped", "needs: deploy failed")
            nothing = cli(s, manager, "run", "approve", second)
            assert nothing.returncode == 4 and "waits for approval" in nothing.stderr


def push_again(s: Stage) -> str:
    """A second run of the same commit (a new delivery id each time)."""
    before = {r["id"] for r in s.api("GET", "/runs").json()["items"]}
    s.push()
    return str(
        wait_until(
            lambda: next(
                (r["id"] for r in s.api("GET", "/runs").json()["items"] if r["id"] not in before), None
            ),
            timeout=30,
            what="the second run",
        )
    )


DEPLOY_ONLY = {
    "ship": """
from conveyor import push, workflow

ship = workflow("ship", on=[push(branches=["main"])])

@ship.job(runs_on=["linux"], environment="production")
def deploy(ctx):
    ctx.sh(["echo", "deployed"])
""",
}


def test_a_restart_keeps_jobs_waiting_and_held_run_retention_days_cancels_old_ones(
    database_url: str, tmp_path: Path
) -> None:
    env = {"CONVEYOR_HELD_RUN_RETENTION_DAYS": "3"}
    with stage(tmp_path, database_url, DEPLOY_ONLY, env) as s:
        protect_production(s, ["admin"])
        first = s.push()
        second = push_again(s)
        for run_id in (first, second):
            wait_job(s, run_id, "deploy", "waiting_approval", timeout=30)
        s.server.stop()
        restarted = ServerProcess(tmp_path / "home", database_url=database_url, env={**FAST, **env})
        try:
            restarted.wait_ready()
            s.server = restarted
            assert {jobs_of(s, r)["deploy"]["status"] for r in (first, second)} == {"waiting_approval"}

            # The first has waited two days: under the 3-day default, over a live cluster setting of 1.
            old = jobs_of(s, first)["deploy"]["id"]
            query(
                database_url,
                "UPDATE jobs SET blocked_since = blocked_since - interval '2 days' WHERE id = :id"
                if database_url.startswith("postgresql")
                else "UPDATE jobs SET blocked_since = datetime(blocked_since, '-2 days') WHERE id = :id",
                id=old,
            )
            patched = s.api("PATCH", "/cluster-settings", json={"held_run_retention_days": 1})
            assert patched.status_code == 200, patched.text
            ended = wait_job(s, first, "deploy", "cancelled", timeout=60)
            assert ended["reason"] == "held_retention: waited more than 1 days for approval"
            assert s.wait_run(first, "cancelled", timeout=30)
            completions = s.api("GET", "/events", params={"name": "__job_complete"}).json()["items"]
            assert any(e["source_run_id"] == first for e in completions)
            assert jobs_of(s, second)["deploy"]["status"] == "waiting_approval"
            # Cancel works on a waiting job too.
            assert s.api("POST", f"/runs/{second}/cancel", json={}).status_code == 202
            assert s.wait_run(second, "cancelled", timeout=30)["jobs"][0]["status"] == "cancelled"

        finally:
            # The stage stops the server it started; this one is the test's to stop.
            restarted.stop()


MANUAL = """
from conveyor import dispatch, workflow

release = workflow("release", on=[dispatch()])

@release.job(runs_on=["linux"], environment="production")
def deploy(ctx):
    ctx.sh(["echo", "deployed"])
"""


def test_the_token_that_started_a_manual_run_may_not_approve_it_when_the_rule_says_so(
    database_url: str, tmp_path: Path
) -> None:
    with stage(tmp_path, database_url, {"release": MANUAL}) as s:
        protect_production(s, ["admin"])
        rule = {"approvers": ["admin"], "prevent_self_approval": True}
        assert s.api("PUT", "/environments/production/protection", json=rule).status_code == 200
        starter, other = token(s, "admin", "starter"), token(s, "admin", "reviewer")
        started = cli(s, starter, "run", "start", "--source", "app", "--workflow", "release", "--json")
        assert started.returncode == 0, started.stderr
        run_id = json.loads(started.stdout)["id"]
        wait_job(s, run_id, "deploy", "waiting_approval", timeout=30)
        refused = cli(s, starter, "run", "approve", run_id)
        assert refused.returncode == 3 and "self_approval" in refused.stderr, refused.stderr
        assert "Traceback" not in refused.stderr
        approved = cli(s, other, "run", "approve", run_id)
        assert approved.returncode == 0, approved.stderr
        assert jobs_of(s, run_id)["deploy"]["status"] == "queued"
