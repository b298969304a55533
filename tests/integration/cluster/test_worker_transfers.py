"""Artifacts and caches of rerouted jobs (docs/design/artifacts.md §4 "Workers", docs/design/caches.md §6):
a database-less worker's agents send their transfer routes to the worker, which forwards them, streamed, to
a coordinator with the job's credential unchanged. Real processes: a coordinator, a worker and the agents its
bare-metal scaler spawns (real `conveyor agent`s, or scripted protocol agents that hold their jobs so the
test can call the worker's routes with their credentials)."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.cache_bytes import restored_bytes
from tests.support.cluster import STEADY_PEERS, Cluster
from tests.support.dispatch_stage import Stage
from tests.support.http import HTTP
from tests.support.waiting import wait_until
from tests.support.worker_cluster import job_logs, scalers_yaml, start

pytestmark = [
    pytest.mark.slow,
    pytest.mark.xdist_group("cluster-processes"),
    pytest.mark.timeout(300),
    pytest.mark.skipif(sys.platform == "win32", reason="POSIX processes"),
]

REPO_ROOT = Path(__file__).resolve().parents[3]

TRANSFERS = """
import hashlib, os
from conveyor import push, workflow

ci = workflow("ci", on=[push(branches=["main"])])

@ci.job(runs_on=["linux"])
def build(ctx):
    deps = ctx.workspace / "deps"
    with ctx.cache("deps-v1", ["deps"]) as hit:
        if not hit:
            deps.mkdir(exist_ok=True)
            (deps / "marker").write_text(ctx.run_id)
    data = os.urandom(5_000_000)
    (ctx.workspace / "big.bin").write_bytes(data)
    digest = hashlib.sha256(data).hexdigest()
    stored = ctx.upload_artifact("big", "big.bin")
    assert stored.sha256 == digest, stored
    return {"sha": digest, "kind": hit.kind, "marker": (deps / "marker").read_text()}

@ci.job(runs_on=["linux"], needs=["build"])
def use(ctx):
    path = ctx.download_artifact("big", "in")
    return {"sha": hashlib.sha256(path.read_bytes()).hexdigest(), "names": [a.name for a in ctx.artifacts]}
"""

TWO_HELD_JOBS = """
from conveyor import push, workflow

ci = workflow("ci", on=[push(branches=["main"])])

@ci.job(runs_on=["linux"])
def first(ctx):
    pass

@ci.job(runs_on=["linux"])
def second(ctx):
    pass
"""

# What the worker's scaler spawns instead of `conveyor agent`: a scripted protocol agent that takes one job,
# writes the dispatch's job id and credential where the test reads them, and holds the job until cancelled.
SCRIPTED_AGENT = """
import asyncio, json, os, sys
sys.path.insert(0, {root!r})
from conveyor.model import protocol as p
from tests.support.protocol_agent import ScriptedAgent

async def main():
    agent = ScriptedAgent(
        os.environ["CONVEYOR_AGENT_URL"],
        os.environ["CONVEYOR_AGENT_TOKEN"],
        agent_id=os.environ["CONVEYOR_AGENT_ID"],
        labels=os.environ["CONVEYOR_AGENT_LABELS"].split(","),
        heartbeat_s=1.0,
        ephemeral=True,
    )
    await agent.connect()
    dispatch = await agent.next_of(p.JobDispatch, timeout=240)
    await agent.accept(dispatch)
    token = dispatch.artifacts.token if dispatch.artifacts else None
    target = os.path.join({capture!r}, dispatch.job_id + ".json")
    with open(target + ".tmp", "w") as out:
        json.dump({{"job_id": dispatch.job_id, "run_id": dispatch.run_id, "token": token}}, out)
    os.replace(target + ".tmp", target)
    await agent.next_of(p.JobCancel, timeout=280)

asyncio.run(main())
"""


def jobs_by_name(stage: Stage, run_id: str) -> dict[str, dict[str, Any]]:
    return {job["name"]: job for job in stage.api("GET", f"/runs/{run_id}/jobs").json()["items"]}


def succeeds(stage: Stage, run_id: str) -> None:
    """Until the run ends; it must have succeeded (else its jobs' logs say why)."""
    run = wait_until(
        lambda: (r := stage.run(run_id))["status"] in ("success", "failed", "cancelled", "timed_out") and r,
        timeout=240,
        what=f"run {run_id} to end",
    )
    if run["status"] != "success":
        logs = {job["name"]: job_logs(stage, run_id, job["id"]) for job in run["jobs"]}
        raise AssertionError(f"run {run_id} ended {run['status']}: {logs}")


@pytest.mark.timeout(600)
def test_a_workers_agents_pass_an_artifact_and_restore_a_cache_through_their_worker(
    any_cluster: Cluster, tmp_path: Path
) -> None:
    # Transfers are tested here, not liveness: a session dropped under load is beside the point.
    stage, _, _ = start(
        any_cluster, tmp_path, TRANSFERS, coordinator_env=STEADY_PEERS, worker_env=STEADY_PEERS
    )
    first_run = stage.push()
    succeeds(stage, first_run)
    jobs = jobs_by_name(stage, first_run)
    assert {name: job["rerouted_to"] for name, job in jobs.items()} == {"build": "w1", "use": "w1"}
    built = jobs["build"]["outputs"]["build"]
    used = jobs["use"]["outputs"]["use"]
    assert (built["kind"], built["marker"]) == ("miss", first_run)
    # Job 2 downloaded through the worker exactly what job 1 uploaded through it…
    assert used == {"sha": built["sha"], "names": ["big"]}
    # …and the coordinator serves the same bytes to the operator.
    answer = stage.api("GET", f"/runs/{first_run}/artifacts/big/content")
    assert answer.status_code == 200, answer.text
    assert hashlib.sha256(answer.content).hexdigest() == built["sha"]

    # The second run's agent is a new ephemeral one, with no local entry: the exact hit came through the
    # worker from the coordinators' store.
    assert restored_bytes(stage) == 0
    second_run = stage.push()
    succeeds(stage, second_run)
    rebuilt = jobs_by_name(stage, second_run)["build"]
    assert rebuilt["rerouted_to"] == "w1"
    assert (rebuilt["outputs"]["build"]["kind"], rebuilt["outputs"]["build"]["marker"]) == (
        "exact",
        first_run,
    )
    assert restored_bytes(stage) > 0


def scripted_scalers_yaml(tmp_path: Path, capture: Path) -> Path:
    script = tmp_path / "scripted_agent.py"
    script.write_text(SCRIPTED_AGENT.format(root=str(REPO_ROOT), capture=str(capture)))
    config = json.loads(scalers_yaml(tmp_path / "scalers.yaml").read_text())
    config["scalers"][0]["command"] = [sys.executable, str(script)]
    path = tmp_path / "scripted.yaml"
    path.write_text(json.dumps(config))
    return path


def _chunks(data: bytes, size: int = 64 * 1024) -> Iterator[bytes]:
    for offset in range(0, len(data), size):
        yield data[offset : offset + size]


@pytest.mark.parametrize("any_cluster", ["sqlite"], indirect=True)
def test_the_worker_forwards_a_held_jobs_transfers_and_refuses_another_jobs_credential(
    any_cluster: Cluster, tmp_path: Path
) -> None:
    capture = tmp_path / "capture"
    capture.mkdir()
    stage, _, worker = start(
        any_cluster,
        tmp_path,
        TWO_HELD_JOBS,
        coordinator_env=STEADY_PEERS,
        worker_env={
            **STEADY_PEERS,
            "CONVEYOR_SCALER_CONFIG": str(scripted_scalers_yaml(tmp_path, capture)),
            # The held jobs never end: the worker's shutdown need not wait for them.
            "CONVEYOR_WORKER_DRAIN_TIMEOUT_MS": "1000",
        },
    )
    run_id = stage.push()

    def both_held() -> list[dict[str, Any]] | None:
        found = [json.loads(path.read_text()) for path in sorted(capture.glob("*.json"))]
        return found if len(found) == 2 else None

    first, second = wait_until(both_held, timeout=180, what="both jobs held by the worker's agents")
    assert first["run_id"] == second["run_id"] == run_id
    assert first["token"].startswith("cvy_job_") and second["token"].startswith("cvy_job_")

    def call(method: str, job: dict[str, Any], token: str, path: str, **kwargs: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}", **kwargs.pop("headers", {})}
        url = f"{worker.url}/api/v1/jobs/{job['job_id']}{path}"
        return HTTP.request(method, url, headers=headers, timeout=30, **kwargs)

    # Another held job's credential, an unknown one, none: refused by the worker itself.
    refused = call("GET", first, second["token"], "/artifacts")
    assert (refused.status_code, refused.json()["error"]) == (403, "forbidden")
    refused = call("GET", {"job_id": "01JOBTHISWORKERDOESNOTHOLD"}, first["token"], "/artifacts")
    assert (refused.status_code, refused.json()["error"]) == (403, "forbidden")
    refused = call("GET", first, "cvy_job_" + "0" * 64, "/artifacts")
    assert (refused.status_code, refused.json()["error"]) == (401, "invalid_token")
    refused = HTTP.get(f"{worker.url}/api/v1/jobs/{first['job_id']}/artifacts", timeout=30)
    assert refused.status_code == 401
    # The job's own credential: the coordinator's answer, through the worker.
    listing = call("GET", first, first["token"], "/artifacts")
    assert (listing.status_code, listing.json()) == (200, {"items": []})

    # An upload streamed through the worker (chunked, no declared length), then its commit.
    data = os.urandom(3 * 1024 * 1024 + 17)
    digest = hashlib.sha256(data).hexdigest()
    upload = HTTP.put(
        f"{worker.url}/api/v1/uploads/{first['job_id']}",
        content=_chunks(data),
        headers={"Authorization": f"Bearer {first['token']}"},
        timeout=60,
    )
    assert upload.status_code == 201, upload.text
    assert (upload.json()["sha256"], upload.json()["size"]) == (digest, len(data))
    made = call(
        "POST",
        first,
        first["token"],
        "/artifacts",
        json={
            "name": "blob",
            "upload_id": upload.json()["upload_id"],
            "sha256": digest,
            "size": len(data),
            "format": "file",
            "filename": "blob.bin",
        },
    )
    assert made.status_code == 201, made.text

    # The run's other job reads it through the worker: a range, then the whole.
    part = call(
        "GET", second, second["token"], "/artifacts/blob/content", headers={"Range": "bytes=1000-1999"}
    )
    assert part.status_code == 206, part.text
    assert part.headers["content-range"] == f"bytes 1000-1999/{len(data)}"
    assert part.content == data[1000:2000]
    whole = call("GET", second, second["token"], "/artifacts/blob/content")
    assert (whole.status_code, whole.headers["etag"]) == (200, f'"{digest}"')
    assert whole.content == data
    unsatisfiable = call(
        "GET", second, second["token"], "/artifacts/blob/content", headers={"Range": "bytes=99999999-"}
    )
    assert unsatisfiable.status_code == 416
    # The other job's credential cannot read it through the first job's routes.
    refused = call("GET", first, second["token"], "/artifacts/blob/content")
    assert refused.status_code == 403
    # The coordinator holds the artifact the worker forwarded.
    listed = stage.api("GET", f"/runs/{run_id}/artifacts").json()["items"]
    assert [(item["name"], item["job_id"], item["sha256"]) for item in listed] == [
        ("blob", first["job_id"], digest)
    ]
    # The worker counts what it refused itself and what it forwarded.
    metrics = worker.get("/metrics").text
    assert 'conveyor_worker_transfers_total{outcome="refused"} 5.0' in metrics
    assert 'conveyor_worker_transfers_total{outcome="forwarded"} 6.0' in metrics
