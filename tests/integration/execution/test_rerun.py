"""Re-runs through the API and the CLI (docs/design/execution.md §8.5, docs/design/admin.md §4, §7)."""

import json
from pathlib import Path

import pytest

from conveyor.model import protocol as p
from tests.support.dispatch_stage import NEEDS_WORKFLOW, stage
from tests.support.processes import run_cli
from tests.support.protocol_agent import ScriptedAgent
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

BUILD_OUTPUTS = {"compile": {"artifact": "app.whl"}}


async def test_failed_only_reruns_only_what_did_not_succeed_and_a_full_rerun_runs_everything(
    database_url: str, tmp_path: Path
) -> None:
    with stage(tmp_path, database_url, {"ci": NEEDS_WORKFLOW}) as s:
        agent = ScriptedAgent(s.ws_url, s.agent_token(["linux"]), capacity=2)
        await agent.connect()
        parent = s.push()
        # A rerun of an active run is refused and creates nothing.
        active = s.api("POST", f"/runs/{parent}/rerun", json={})
        assert active.status_code == 409 and active.json()["error"] == "conflict", active.text
        build = await agent.next_of(p.JobDispatch)
        await agent.accept(build)
        await agent.send(
            p.JobFinished(oseq=100, job_id=build.job_id, status="success", outputs=BUILD_OUTPUTS)
        )
        await agent.wait_acked(100)
        for _ in range(2):
            dispatch = await agent.next_of(p.JobDispatch)
            await agent.accept(dispatch)
            failed = dispatch.job["name"] == "test"
            await agent.wait_acked(
                await agent.finish(
                    dispatch.job_id, "failed" if failed else "success", "step_failed: x" if failed else None
                )
            )
        s.wait_run(parent, "failed")
        assert len(s.api("GET", "/runs").json()["items"]) == 1

        answer = s.api("POST", f"/runs/{parent}/rerun", json={"failed_only": True})
        assert answer.status_code == 201, answer.text
        child = answer.json()
        assert child["parent_run_id"] == parent and child["sha"] == s.run(parent)["sha"]
        by_name = {j["name"]: j for j in child["jobs"]}
        assert by_name["build"]["status"] == "success" and by_name["build"]["outputs"] == BUILD_OUTPUTS
        assert by_name["report"]["status"] == "success"
        # The dispatcher may already have handed the job out when the answer is read.
        assert by_name["test"]["status"] in {"queued", "dispatched"}
        again = await agent.next_of(p.JobDispatch)
        assert (again.run_id, again.job["name"]) == (child["id"], "test")
        assert again.upstream["build"] == {"status": "success", "outputs": BUILD_OUTPUTS, "by_matrix": {}}
        await agent.accept(again)
        await agent.wait_acked(await agent.finish(again.job_id, "success"))
        s.wait_run(child["id"], "success")

        env = {"CONVEYOR_URL": s.server.url, "CONVEYOR_TOKEN": s.token}
        full = run_cli(["admin", "run", "rerun", parent, "--json"], env=env)
        assert full.returncode == 0, full.stderr
        rerun = json.loads(full.stdout)
        assert rerun["parent_run_id"] == parent
        statuses = {j["name"]: j["status"] for j in rerun["jobs"]}
        assert statuses["build"] in {"queued", "dispatched"}
        assert (statuses["test"], statuses["report"]) == ("pending", "pending")
        first = await agent.next_of(p.JobDispatch)
        assert (first.run_id, first.job["name"]) == (rerun["id"], "build")
        await agent.close()


def test_rerun_refuses_bad_input_without_creating_a_run(database_url: str, tmp_path: Path) -> None:
    with stage(tmp_path, database_url, {"ci": NEEDS_WORKFLOW}) as s:
        missing = s.api("POST", "/runs/00000000-0000-0000-0000-000000000000/rerun", json={})
        assert missing.status_code == 404 and missing.json()["error"] == "not_found"
        run_id = s.push()
        unknown_field = s.api("POST", f"/runs/{run_id}/rerun", json={"failed": True})
        assert unknown_field.status_code == 422 and "failed" in unknown_field.json()["detail"]
        env = {"CONVEYOR_URL": s.server.url, "CONVEYOR_TOKEN": s.token}
        cli = run_cli(["admin", "run", "rerun", "00000000-0000-0000-0000-000000000000"], env=env)
        assert cli.returncode == 4 and "not_found" in cli.stderr and "Traceback" not in cli.stderr
        busy = run_cli(["admin", "run", "rerun", run_id], env=env)
        assert busy.returncode == 1 and "conflict" in busy.stderr and "Traceback" not in busy.stderr
        wait_until(lambda: len(s.api("GET", "/runs").json()["items"]) == 1, what="still one run")
