"""End to end: an `event` scaler provisions a machine through a workflow (docs/design/scaler.md §6.4).

A job asks for `[cloud]`; no agent has it. The scaler emits `conveyor.scaler.scale_up`; the example
provisioning workflow (examples/event_scaler_provisioning.py) runs on an ordinary `provisioner` agent
and asks a fake cloud for a machine; the machine runs `conveyor agent --claim CODE --url URL`, which
redeems the code, registers as the spawn's agent and runs the job. Its exit ends the spawn:
`conveyor.scaler.scale_down` runs the deprovisioning workflow, which deletes the machine. The code
cannot be redeemed a second time.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.agents import agent_process, set_secret
from tests.support.cloud import FakeCloud
from tests.support.dispatch_stage import FAST, Stage, stage
from tests.support.http import HTTP
from tests.support.processes import run_cli
from tests.support.repos import commit_all, git, write_workflows
from tests.support.sql import query
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.skipif(sys.platform == "win32", reason="POSIX sessions")]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "event_scaler_provisioning.py"

APP = """
from conveyor import push, workflow

ci = workflow("ci", on=[push(branches=["main"])])

@ci.job(runs_on=["cloud"], checkout=False)
def build(ctx):
    ctx.sh(["echo", "built in the cloud"])
"""

SCALERS = {
    "version": 1,
    "scalers": [
        {
            "name": "cloud",
            "type": "event",
            "max_agents": 1,
            "provisioning_targets": ["app"],
            "provisioning_label": "provisioner",
            "claim_ttl_s": 300,
            "label_sets": [{"labels": ["cloud"]}],
        }
    ],
}

ENV = {
    **FAST,
    "CONVEYOR_EVENTS_POLL_SECONDS": "0.5",
    "CONVEYOR_EVENTS_SCAN_SECONDS": "0.5",
    "CONVEYOR_SCALER_PROVISION_BACKOFF_BASE_MS": "30000",
    "CONVEYOR_SCALER_PROVISION_BACKOFF_MAX_MS": "60000",
}


def _events(s: Stage, name: str) -> list[dict[str, Any]]:
    answer = s.api("GET", "/events", params={"name": name, "limit": 50})
    assert answer.status_code == 200, answer.text
    return answer.json()["items"]  # type: ignore[no-any-return]


def _payload(s: Stage, event_id: str) -> dict[str, Any]:
    return s.api("GET", f"/events/{event_id}/payload").json()["payload"]  # type: ignore[no-any-return]


def _sync_registrations(s: Stage) -> None:
    """Trigger HEAD (which holds only the provisioning workflows) and wait for their registrations."""
    sha = git(s.repo, "rev-parse", "HEAD")
    answer = s.api("POST", f"/sources/{s.source_id}/trigger", json={"ref": "refs/heads/main", "sha": sha})
    assert answer.status_code == 202, answer.text

    def registered() -> bool:
        items = s.api("GET", "/registrations", params={"limit": 500}).json()["items"]
        return {r["workflow_name"] for r in items} >= {"provision-cloud-agent", "deprovision-cloud-agent"}

    wait_until(registered, timeout=60, what="the provisioning workflows' registrations")


def test_a_workflow_provisions_the_agent_that_runs_the_job(database_url: str, tmp_path: Path) -> None:
    (tmp_path / "scalers.yaml").write_text(json.dumps(SCALERS))
    env = {**ENV, "CONVEYOR_SCALER_CONFIG": str(tmp_path / "scalers.yaml")}
    provisioning = {"provision": EXAMPLE.read_text()}
    with FakeCloud(tmp_path / "cloud") as cloud, stage(tmp_path, database_url, provisioning, env=env) as s:
        set_secret(s, "CLOUD_API_URL", cloud.url)
        set_secret(s, "CLOUD_API_TOKEN", cloud.token)
        _sync_registrations(s)
        write_workflows(s.repo, {**provisioning, "app": APP})
        commit_all(s.repo, "the app's workflow")
        with agent_process(s, tmp_path / "provisioner-home", labels="provisioner"):
            run_id = s.push()
            run = s.wait_run(run_id, "success", timeout=240)

            ups = _events(s, "conveyor.scaler.scale_up")
            assert len(ups) == 1 and ups[0]["match_outcome"] == "matched", ups
            up = _payload(s, ups[0]["id"])
            agent_id = up["agent_id"]
            build = next(j for j in run["jobs"] if j["name"] == "build")
            assert up["claim_code"] == "[redacted]"
            assert up["scaler"] == "cloud" and up["labels"] == ["cloud"] and up["bound_job_id"] == build["id"]
            # The machine the workflow asked for ran the spawn's agent, and that agent ran the job.
            machine = cloud.machines[f"conveyor-{agent_id}"]
            assert machine.labels == ["cloud"]
            jobs = query(database_url, f"SELECT agent_id FROM jobs WHERE id = '{build['id']}'")
            assert jobs == [{"agent_id": agent_id}], machine.output()
            assert (tmp_path / "cloud" / f"conveyor-{agent_id}" / "claim.json").exists()

            # Single use: the agent exits after its job, the spawn ends, scale_down deletes the machine.
            downs = wait_until(
                lambda: [e for e in _events(s, "conveyor.scaler.scale_down") if e["state"] == "processed"],
                timeout=120,
                what="scale_down processed",
            )
            down = _payload(s, downs[0]["id"])
            assert down["agent_id"] == agent_id and down["scaler"] == "cloud" and down["reason"]
            wait_until(
                lambda: machine.deleted, timeout=120, what="the deprovisioning workflow to delete the machine"
            )
            # The machine's agent logs its exit before the interpreter is gone: wait for the process.
            assert machine.proc.wait(timeout=60) == 0, machine.output()
            history = query(
                database_url,
                f"SELECT outcome, bound_job_id FROM scaler_spawn_history WHERE agent_id = '{agent_id}'",
            )
            assert history == [{"outcome": "registered", "bound_job_id": build["id"]}]
            runs = s.api("GET", "/runs", params={"limit": 50}).json()["items"]
            provision = next(r for r in runs if r["workflow"] == "provision-cloud-agent")
            assert provision["status"] == "success"
            code = machine.command[machine.command.index("--claim") + 1]
            # The code reaches the provisioning job, but no read surface shows it.
            shown = s.api("GET", f"/runs/{provision['id']}")
            assert shown.status_code == 200 and code not in shown.text, shown.text[:2000]

            # The code was single use: a replay is refused exactly as an unknown code is.
            replay = HTTP.post(f"{s.server.url}/api/v1/agents/claim", json={"claim_code": code}, timeout=30)
            unknown = HTTP.post(
                f"{s.server.url}/api/v1/agents/claim",
                json={"claim_code": "cvy_claim_" + "0" * 64},
                timeout=30,
            )
            assert replay.status_code == unknown.status_code == 401
            assert replay.json() == unknown.json() and replay.json()["error"] == "invalid_claim"
            refused = run_cli(["agent", "--claim", code, "--url", s.ws_url, "--home", str(tmp_path / "late")])
            assert refused.returncode == 3, refused.stderr
            assert "the claim was refused (401)" in refused.stderr and "Traceback" not in refused.stderr
            assert not (tmp_path / "late" / "claim.json").exists()


def test_claim_with_a_token_is_a_usage_error(tmp_path: Path) -> None:
    both = run_cli(
        ["agent", "--claim", "c", "--token", "t", "--url", "http://127.0.0.1:9", "--home", str(tmp_path)]
    )
    assert both.returncode == 2 and "do not pass --token" in both.stderr and "Traceback" not in both.stderr
    bad_url = run_cli(["agent", "--claim", "c", "--url", "ftp://h", "--home", str(tmp_path)])
    assert bad_url.returncode == 2 and "--url must be" in bad_url.stderr
