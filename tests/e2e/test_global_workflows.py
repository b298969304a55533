"""End to end: a push to repository A runs A's own workflow and the policy source's global licence scan on a
real agent, the scan importing its workflow from the policy repository with A's commit as its workspace
(docs/design/global_workflows.md §5), and fails on A's commit that breaks its rule."""

from pathlib import Path
from typing import Any

import pytest

from tests.support.agents import agent_process, job_log
from tests.support.dispatch_stage import Stage, stage
from tests.support.repos import commit_all, git, make_repo
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

CI = """
from conveyor import push, workflow

ci = workflow("ci", on=[push(branches=["main"])])

@ci.job(runs_on=["linux"])
def build(ctx):
    ctx.sh(["echo", "built"])
"""

SCAN = """
from conveyor import push, workflow

scan = workflow("licence-scan", on=[push()], global_repos=["local:app"], required=True)

@scan.job(runs_on=["linux"])
def licences(ctx):
    ctx.sh(["cat", "NOTICE.txt"])
    ctx.sh(["grep", "-q", "MIT", "NOTICE.txt"])
"""


def trigger(s: Stage, source_id: str, repo: Path) -> dict[str, Any]:
    sha = git(repo, "rev-parse", "HEAD")
    answer = s.api("POST", f"/sources/{source_id}/trigger", json={"ref": "refs/heads/main", "sha": sha})
    assert answer.status_code == 202, answer.text
    delivery = answer.json()["delivery"]

    def processed() -> dict[str, Any] | None:
        row: dict[str, Any] = s.api("GET", f"/deliveries/{delivery}").json()
        return row if row["status"] == "processed" else None

    return wait_until(processed, timeout=60, what="the push processed")


def runs_by_workflow(s: Stage, delivery: dict[str, Any]) -> dict[str, str]:
    return {s.run(run_id)["workflow"]: run_id for run_id in delivery["runs"]}


def test_a_push_runs_the_policy_sources_global_scan_on_the_pushed_commit(
    database_url: str, tmp_path: Path
) -> None:
    with stage(tmp_path, database_url, {"ci": CI}) as s:
        (s.repo / "NOTICE.txt").write_text("app: MIT licence\n")
        commit_all(s.repo, "notice")
        policy = make_repo(tmp_path / "policy", {"scan": SCAN})
        answer = s.api("POST", "/sources", json={"kind": "local", "name": "policy", "path": str(policy)})
        assert answer.status_code == 201, answer.text
        policy_id = answer.json()["id"]
        answer = s.api("PATCH", "/org-settings/default", json={"global_sources": "local:policy"})
        assert answer.status_code == 200, answer.text
        trigger(s, policy_id, policy)
        with agent_process(s, tmp_path / "agent-home"):
            runs = runs_by_workflow(s, trigger(s, s.source_id, s.repo))
            assert set(runs) == {"ci", "local:policy/licence-scan"}
            s.wait_run(runs["ci"], "success", timeout=120)
            scan = s.wait_run(runs["local:policy/licence-scan"], "success", timeout=120)
            assert scan["sha"] == git(s.repo, "rev-parse", "HEAD") and scan["repo"] == "app"
            (job,) = scan["jobs"]
            assert "app: MIT licence" in job_log(s, scan["id"], job["id"])

            # A's next commit drops the licence: the required scan fails on it.
            (s.repo / "NOTICE.txt").write_text("app: proprietary\n")
            commit_all(s.repo, "no licence")
            runs = runs_by_workflow(s, trigger(s, s.source_id, s.repo))
            s.wait_run(runs["ci"], "success", timeout=120)
            s.wait_run(runs["local:policy/licence-scan"], "failed", timeout=120)
