"""A coordinator and a database-less worker as real processes, with workflows whose jobs wait on a gate, and what they logged."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.cluster import Cluster, Node
from tests.support.dispatch_stage import FAST, Stage
from tests.support.repos import make_repo
from tests.support.scaler_e2e import scalers_yaml as local_scalers_yaml
from tests.support.waiting import wait_until

SECRET = "worker-secret-4242-value"


WORKFLOW = """
from conveyor import push, workflow

ci = workflow("ci", on=[push(branches=["main"])])

@ci.job(runs_on=["linux"])
def build(ctx):
    key = ctx.secrets.get("DEPLOY_KEY")
    print("built with", key)
    ctx.sh(["echo", "built on a worker's agent"])
"""


SLOW_WORKFLOW = """
from conveyor import push, workflow
import pathlib, time

ci = workflow("ci", on=[push(branches=["main"])])

@ci.job(runs_on=["linux"])
def build(ctx):
    print("running with", ctx.secrets.get("DEPLOY_KEY"))
    ctx.sh(["echo", "started"])
    gate = pathlib.Path({gate!r})
    deadline = time.monotonic() + 120
    while not gate.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    ctx.sh(["echo", "finished after the gate"])
"""


COORDINATOR_ENV = {
    **FAST,
    "CONVEYOR_REROUTE_ACK_TIMEOUT_MS": "5000",
    "CONVEYOR_REROUTE_FLAP_GRACE_MS": "2000",
    "CONVEYOR_REROUTE_SPAWN_WINDOW_MS": "60000",
}


def scalers_yaml(path: Path) -> Path:
    """`path` holding the bare-metal `local` scaler of the end-to-end tests (`scaler_e2e.scalers_yaml`)."""
    path.write_text(local_scalers_yaml())
    return path


def start(
    cluster: Cluster,
    tmp_path: Path,
    workflow: str = WORKFLOW,
    *,
    via_proxy: bool = False,
    coordinators: int = 1,
    coordinator_env: dict[str, str] | None = None,
    worker_env: dict[str, str] | None = None,
) -> tuple[Stage, list[Node], Node]:
    """Coordinator(s) with a local source and an org secret, and one worker with a bare-metal scaler."""
    nodes = [
        cluster.coordinator(f"c{i + 1}", **{**COORDINATOR_ENV, **(coordinator_env or {})})
        for i in range(coordinators)
    ]
    stage = Stage(nodes[0].process, make_repo(tmp_path / "repo", {"ci": workflow}))
    stage.add_source()
    answer = stage.api("PUT", "/secrets/org/DEPLOY_KEY", json={"value": SECRET})
    assert answer.status_code in (200, 201), answer.text
    worker = cluster.worker(
        "w1",
        nodes,
        join_token=cluster.join_token(nodes[0]),
        via_proxy=via_proxy,
        **{
            "CONVEYOR_SCALER_CONFIG": str(scalers_yaml(tmp_path / "scalers.yaml")),
            "CONVEYOR_AGENT_DEAD_AFTER_MS": "30000",
            **(worker_env or {}),
        },
    )
    for node in nodes:
        wait_until(
            lambda n=node: _worker_has_capacity(n, cluster.token), timeout=60, what="the worker's capacity"
        )
    return stage, nodes, worker


def _worker_has_capacity(node: Node, token: str) -> bool:
    answer = node.get("/api/v1/admin/peers", token)
    return any(p["instance_id"] == "w1" and p["connected"] for p in answer.json()["items"])


def job_logs(stage: Stage, run_id: str, job_id: str) -> str:
    answer = stage.api(
        "GET", f"/runs/{run_id}/jobs/{job_id}/logs", params={"offset": 0, "limit_bytes": 65536}
    )
    assert answer.status_code == 200, answer.text
    return str(answer.json()["text"])


def single_job(stage: Stage, run_id: str) -> dict[str, Any]:
    (job,) = stage.run(run_id)["jobs"]
    return job  # type: ignore[no-any-return]


def open_gate(gate: Path) -> None:
    gate.write_text("go")


def wait_started(stage: Stage, run_id: str) -> dict[str, Any]:
    return wait_until(
        lambda: (
            (job := single_job(stage, run_id))["status"] == "running"
            and "started" in job_logs(stage, run_id, job["id"])
            and job
        ),
        timeout=120,
        what="the job to run on the worker",
    )
