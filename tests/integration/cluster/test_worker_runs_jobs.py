"""Database-less workers run jobs (docs/design/cluster.md §4): a coordinator with no agent and no scaler
reroutes a pushed job to a worker, whose bare-metal scaler spawns a real `conveyor agent` that runs it."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.agents import agent_process
from tests.support.cluster import STEADY_PEERS, Cluster, Node
from tests.support.dispatch_stage import Stage
from tests.support.processes import run_cli
from tests.support.repos import make_repo
from tests.support.scaler_backends import NEVER_REGISTERS
from tests.support.scaler_e2e import processes_under
from tests.support.waiting import wait_until
from tests.support.worker_cluster import (
    COORDINATOR_ENV,
    SECRET,
    SLOW_WORKFLOW,
    WORKFLOW,
    job_logs,
    open_gate,
    scalers_yaml,
    single_job,
    start,
    wait_started,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.xdist_group("cluster-processes"),
    pytest.mark.skipif(sys.platform == "win32", reason="POSIX processes"),
]


def two_workers(
    cluster: Cluster, tmp_path: Path, first_command: list[str], coordinator_env: dict[str, str]
) -> tuple[Stage, Node, dict[str, Node]]:
    """A coordinator and two workers: w1 ranks first (more scaler room) but spawns `first_command`;
    w2's scaler works. Returns once both are connected."""
    # Spawn budgets and take-backs are tested here, not liveness: a session dropped under load past the
    # 2 s flap grace would send the job on while its worker still runs it.
    coordinator = cluster.coordinator("c1", **{**COORDINATOR_ENV, **STEADY_PEERS, **coordinator_env})
    stage = Stage(coordinator.process, make_repo(tmp_path / "repo", {"ci": WORKFLOW}))
    stage.add_source()
    answer = stage.api("PUT", "/secrets/org/DEPLOY_KEY", json={"value": SECRET})
    assert answer.status_code in (200, 201), answer.text
    first = json.loads(scalers_yaml(tmp_path / "first.yaml").read_text())
    first["scalers"][0].update(max_agents=3, command=first_command)
    (tmp_path / "first.yaml").write_text(json.dumps(first))
    workers = {
        name: cluster.worker(
            name,
            [coordinator],
            join_token=cluster.join_token(coordinator),
            CONVEYOR_SCALER_CONFIG=str(config),
            CONVEYOR_AGENT_DEAD_AFTER_MS="30000",
            # A worker's spawn retry also waits out its scaler's provision backoff (30 s by default).
            CONVEYOR_SCALER_PROVISION_BACKOFF_BASE_MS="1000",
            **STEADY_PEERS,
        )
        for name, config in (("w1", tmp_path / "first.yaml"), ("w2", scalers_yaml(tmp_path / "working.yaml")))
    }

    def both_connected() -> bool:
        answer = coordinator.get("/api/v1/admin/peers", cluster.token)
        return {p["instance_id"] for p in answer.json()["items"] if p["connected"]} >= {"w1", "w2"}

    wait_until(both_connected, timeout=60, what="both workers connected")
    return stage, coordinator, workers


def files_containing(root: Path, needle: bytes) -> list[Path]:
    """Every regular file under `root` whose bytes contain `needle`."""
    found = []
    for path in root.rglob("*"):
        try:
            if path.is_file() and not path.is_symlink() and needle in path.read_bytes():
                found.append(path)
        except OSError:
            continue
    return found


def test_a_push_runs_on_an_agent_the_worker_spawned_with_its_secret_masked(
    any_cluster: Cluster, tmp_path: Path
) -> None:
    stage, (coordinator,), worker = start(any_cluster, tmp_path)
    run_id = stage.push()
    run = stage.wait_run(run_id, "success", timeout=120)
    (job,) = run["jobs"]
    assert job["rerouted_to"] == "w1" and job["reroute_hop"] == 1 and job["reroute_tried"] == ["c1"]
    assert job["reroute_window_expires_at"] is None  # disarmed by the worker's first progress
    assert job["agent_id"] and not job["agent_id"].startswith("worker:")  # the worker's spawned agent
    assert [step["status"] for step in job["steps"]] and all(
        step["status"] == "success" for step in job["steps"]
    )
    wait_until(
        lambda: "built on a worker's agent" in job_logs(stage, run_id, job["id"]), timeout=30, what="logs"
    )
    text = job_logs(stage, run_id, job["id"])
    assert "built with ***" in text and SECRET not in text
    followed = run_cli(
        ["admin", "run", "logs", run_id, "--follow"],
        env={"CONVEYOR_URL": coordinator.url, "CONVEYOR_TOKEN": any_cluster.token},
    )
    assert followed.returncode == 0, followed.stderr
    assert "built on a worker's agent" in followed.stdout and "built with ***" in followed.stdout
    assert SECRET not in followed.stdout
    shown = run_cli(
        ["admin", "run", "show", run_id],
        env={"CONVEYOR_URL": coordinator.url, "CONVEYOR_TOKEN": any_cluster.token},
    )
    assert shown.returncode == 0, shown.stderr
    assert "reroutes" in shown.stdout and "on w1 hop 1" in shown.stdout  # the worker it ran on
    # Never on the worker's disk: not its home (outbox, credential), its agents' homes or workspaces.
    assert files_containing(worker.home, SECRET.encode()) == []
    assert not (worker.home / "outbox").exists() or list((worker.home / "outbox").iterdir()) == []
    ready = worker.get("/ready").json()
    assert ready["checks"]["jobs"]["detail"].startswith("runs rerouted jobs: 0 held")
    assert "conveyor_worker_outbox_pending 0.0" in worker.get("/metrics").text
    assert 'conveyor_reroute_total{outcome="accepted"} 1.0' in coordinator.get("/metrics").text


def outbox_files(worker: Node) -> list[Path]:
    directory = worker.home / "outbox"
    return sorted(directory.glob("*.json")) if directory.exists() else []


def test_a_cut_link_mid_job_delivers_the_terminal_status_once_after_restore(
    any_cluster: Cluster, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    stage, (coordinator,), worker = start(
        any_cluster,
        tmp_path,
        SLOW_WORKFLOW.format(gate=str(gate)),
        via_proxy=True,
        # The cut outlasts no grace: the sweep must leave the job alone while the worker is away.
        coordinator_env={"CONVEYOR_REROUTE_FLAP_GRACE_MS": "120000"},
    )
    run_id = stage.push()
    job = wait_started(stage, run_id)
    # While the job runs, its agent's home and workspace are under the worker's home: no secret there.
    assert (worker.home / "scaler" / "work").is_dir()
    assert files_containing(worker.home, SECRET.encode()) == []
    assert "running with ***" in job_logs(stage, run_id, job["id"])

    any_cluster.cut_link(worker, coordinator)
    wait_until(
        lambda: not worker.get("/ready").json()["ready"], timeout=30, what="the worker to notice the cut"
    )
    open_gate(gate)
    # The job finishes on the worker while no coordinator hears it: its result waits in the outbox.
    (entry,) = wait_until(lambda: outbox_files(worker), timeout=60, what="the result in the outbox")
    assert SECRET.encode() not in entry.read_bytes()
    assert single_job(stage, run_id)["status"] == "running"

    any_cluster.restore_link(worker, coordinator)
    finished = stage.wait_run(run_id, "success", timeout=90)["jobs"][0]
    wait_until(lambda: outbox_files(worker) == [], timeout=30, what="the outbox entry to be acknowledged")
    assert "finished after the gate" in job_logs(stage, run_id, job["id"])
    # Applied once: a second delivery of the same result (the worker re-sends on every reconnect until
    # acknowledged) changes nothing.
    assert single_job(stage, run_id)["finished_at"] == finished["finished_at"]
    assert applied_count(coordinator, job["id"]) == 1


def applied_count(node: Node, job_id: str) -> int:
    """How many times a coordinator applied a worker's terminal result for the job (its log says)."""
    return node.output().count(f"applied the terminal result of job {job_id}")


def test_a_worker_killed_before_the_ack_replays_its_outbox_after_restart_and_the_run_ends_once(
    any_cluster: Cluster, tmp_path: Path
) -> None:
    # The coordinator withholds its first progress ack: the window between "finished" and "acked"
    # stays open until the worker is killed in it.
    stage, (coordinator,), worker = start(
        any_cluster, tmp_path, coordinator_env={"CONVEYOR_TEST_WITHHOLD_PROGRESS_ACKS": "1"}
    )
    run_id = stage.push()
    job = stage.wait_run(run_id, "success", timeout=120)["jobs"][0]
    (entry,) = wait_until(lambda: outbox_files(worker), timeout=30, what="the unacknowledged result")
    assert SECRET.encode() not in entry.read_bytes()

    worker.kill9()
    worker.process = worker._spawn()  # same home (credential, instance id, outbox), same port
    worker.wait_ready()
    wait_until(lambda: outbox_files(worker) == [], timeout=60, what="the replayed result to be acknowledged")
    again = single_job(stage, run_id)
    assert again["status"] == "success" and again["finished_at"] == job["finished_at"]
    assert applied_count(coordinator, job["id"]) == 1
    assert "changed nothing" in coordinator.output()


def test_the_other_coordinator_applies_the_result_when_the_owner_is_killed(
    pg_cluster: Cluster, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    stage, coordinators, worker = start(
        pg_cluster,
        tmp_path,
        SLOW_WORKFLOW.format(gate=str(gate)),
        coordinators=2,
        coordinator_env={"CONVEYOR_REROUTE_FLAP_GRACE_MS": "60000"},
    )
    run_id = stage.push()
    job = wait_started(stage, run_id)
    owner = next(node for node in coordinators if node.name == job["instance_id"])
    other = next(node for node in coordinators if node is not owner)

    owner.kill9()
    open_gate(gate)

    def status() -> str:
        answer = other.get(f"/api/v1/admin/runs/{run_id}", pg_cluster.token)
        return str(answer.json()["status"])

    wait_until(
        lambda: status() == "success", timeout=120, what="the run to succeed through the other coordinator"
    )
    wait_until(lambda: outbox_files(worker) == [], timeout=30, what="the result to be acknowledged")
    assert applied_count(other, job["id"]) == 1


def test_cancelling_a_run_stops_its_job_on_the_worker(any_cluster: Cluster, tmp_path: Path) -> None:
    gate = tmp_path / "gate"  # never opened: the job runs until it is cancelled
    stage, _, worker = start(any_cluster, tmp_path, SLOW_WORKFLOW.format(gate=str(gate)))
    run_id = stage.push()
    wait_started(stage, run_id)

    answer = stage.api("POST", f"/runs/{run_id}/cancel", json={"reason": "enough"})
    assert answer.status_code == 202, answer.text
    job = stage.wait_run(run_id, "cancelled", timeout=90)["jobs"][0]
    assert job["status"] == "cancelled"
    assert "finished after the gate" not in job_logs(stage, run_id, job["id"])
    wait_until(lambda: outbox_files(worker) == [], timeout=30, what="the cancelled result to be acknowledged")
    assert "cancelled by its coordinator" in worker.output()


def test_a_worker_drained_through_its_coordinator_takes_no_job_until_resumed(
    any_cluster: Cluster, tmp_path: Path
) -> None:
    stage, (coordinator,), _ = start(any_cluster, tmp_path)
    drained = coordinator.post(
        "/api/v1/admin/orchestrator/drain", any_cluster.token, {"action": "drain", "target": "w1"}
    )
    assert drained.status_code == 200 and drained.json()["draining"] is True, drained.text
    # The coordinator sees the flag in the worker's next heartbeat and offers it nothing.
    wait_until(
        lambda: next(
            p
            for p in coordinator.get("/api/v1/admin/peers", any_cluster.token).json()["items"]
            if p["instance_id"] == "w1"
        )["draining"],
        what="the coordinator to see w1 draining",
    )
    run_id = stage.push()
    # The sweep finds nothing that can run it (the only worker drains, so it is no candidate either).
    wait_until(
        lambda: str(single_job(stage, run_id).get("reason") or "").startswith("unschedulable"),
        timeout=30,
        what="the job to be noted unschedulable",
    )
    assert single_job(stage, run_id)["rerouted_to"] is None
    assert 'conveyor_reroute_total{outcome="accepted"}' not in coordinator.get("/metrics").text

    resumed = coordinator.post(
        "/api/v1/admin/orchestrator/drain", any_cluster.token, {"action": "resume", "target": "w1"}
    )
    assert resumed.status_code == 200 and resumed.json()["draining"] is False, resumed.text
    job = stage.wait_run(run_id, "success", timeout=120)["jobs"][0]
    assert job["rerouted_to"] == "w1"


def test_sigterm_lets_the_running_job_finish_has_its_result_acked_and_exits_0(
    any_cluster: Cluster, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    stage, (coordinator,), worker = start(any_cluster, tmp_path, SLOW_WORKFLOW.format(gate=str(gate)))
    run_id = stage.push()
    job = wait_started(stage, run_id)

    worker.process.signal(signal.SIGTERM)
    # Draining first: the worker says so before its running job ends.
    wait_until(
        lambda: next(
            p
            for p in coordinator.get("/api/v1/admin/peers", any_cluster.token).json()["items"]
            if p["instance_id"] == "w1"
        )["draining"],
        what="the coordinator to see w1 draining",
    )
    assert single_job(stage, run_id)["status"] == "running"
    open_gate(gate)
    assert worker.process.wait_exit(timeout=120) == 0
    finished = single_job(stage, run_id)
    assert finished["status"] == "success", finished
    assert outbox_files(worker) == []  # acked before the worker exited
    assert applied_count(coordinator, job["id"]) == 1
    assert "finished after the gate" in job_logs(stage, run_id, job["id"])


@pytest.mark.parametrize(
    ("overrides", "relayed"),
    [
        (["reroute_spawn_max_attempts=1"], [("w1", 1, True)]),
        (
            ["reroute_spawn_max_attempts=2", "reroute_spawn_retry_backoff_ms=1000"],
            [("w1", 1, False), ("w1", 2, True)],
        ),
    ],
    ids=["budget-1", "scenario-7"],
)
def test_a_job_whose_spawn_fails_on_one_worker_runs_on_the_next_with_the_same_job_id(
    any_cluster: Cluster, tmp_path: Path, overrides: list[str], relayed: list[tuple[str, int, bool]]
) -> None:
    # The spawn budget comes from the org's overrides, set through the CLI on a running coordinator
    # whose cluster default stays 3: the next reroute carries the org's values
    # (docs/design/cluster.md §4.3, §6). w1's agents exit before registering. Budget 1: its first failed spawn
    # gives the job back (`final: true`). Scenario 7 (budget 2, 1 s apart): the first failure is relayed
    # `final: false` and re-arms the window, the second is final. Either way the coordinator offers the same
    # job to the next worker with hop 2 (docs/design/cluster.md §4.4), where it succeeds.
    stage, coordinator, _ = two_workers(
        any_cluster, tmp_path, [sys.executable, "-c", "raise SystemExit(3)"], {}
    )
    org = source_org(coordinator, stage.source_id)
    assert cluster_knob(coordinator, any_cluster.token, "reroute_spawn_max_attempts") == 3
    overridden = run_cli(
        ["admin", "org-settings", "set", org, *overrides],
        env={"CONVEYOR_URL": coordinator.url, "CONVEYOR_TOKEN": any_cluster.token},
    )
    assert overridden.returncode == 0, overridden.stderr
    assert cluster_knob(coordinator, any_cluster.token, "reroute_spawn_max_attempts") == 3

    run_id = stage.push()
    job = stage.wait_run(run_id, "success", timeout=120)["jobs"][0]
    assert (job["rerouted_to"], job["reroute_hop"], job["reroute_tried"]) == ("w2", 2, ["c1", "w1"])
    # w1 spent the org's budget: one relayed failure per spawn, only the last one final.
    relays = [entry["detail"] for entry in spawn_failures_in_timeline(coordinator, job["id"])]
    assert [(r["worker"], r["attempt"], r["final"]) for r in relays] == relayed
    assert "built on a worker's agent" in job_logs(stage, run_id, job["id"])
    metrics = coordinator.get("/metrics").text
    assert 'conveyor_reroute_redispatch_total{reason="final"} 1.0' in metrics


def source_org(node: Node, source_id: str) -> str:
    """The org a source (and so its runs and jobs) belongs to, from the coordinator's database."""
    from sqlalchemy import select

    from conveyor.db.engine import create_sync_engine
    from conveyor.db.tables import sources

    engine = create_sync_engine(node.database_url or f"sqlite:///{node.home / 'conveyor.db'}")
    try:
        with engine.connect() as conn:
            return str(conn.execute(select(sources.c.org_id).where(sources.c.id == source_id)).scalar_one())
    finally:
        engine.dispose()


def cluster_knob(node: Node, token: str, name: str) -> int:
    """A cluster knob's effective value, as `conveyor admin cluster-settings show --json` prints it."""
    shown = run_cli(
        ["admin", "cluster-settings", "show", "--json"],
        env={"CONVEYOR_URL": node.url, "CONVEYOR_TOKEN": token},
    )
    assert shown.returncode == 0, shown.stderr
    return int(json.loads(shown.stdout)["effective"][name])


FLAKY_SPAWNER = """
import os, sys
counter = sys.argv[1]
attempt = int(open(counter).read() or 0) + 1 if os.path.exists(counter) else 1
open(counter, "w").write(str(attempt))
if attempt <= 2:
    raise SystemExit(3)  # the first two spawns die before the agent registers
os.execv(sys.executable, [sys.executable, "-m", "conveyor", "agent", "--ephemeral"])
"""


def spawn_failures_in_timeline(coordinator: Node, job_id: str) -> list[dict[str, Any]]:
    """The coordinator's `scaler.failed` timeline entries of a job (relayed spawn failures,
    docs/design/cluster.md §4.3)."""
    from sqlalchemy import select

    from conveyor.db.engine import create_sync_engine
    from conveyor.db.tables import run_timeline

    url = coordinator.database_url or f"sqlite:///{coordinator.home / 'conveyor.db'}"
    engine = create_sync_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                select(run_timeline)
                .where(run_timeline.c.job_id == job_id, run_timeline.c.kind == "scaler.failed")
                .order_by(run_timeline.c.at)
            ).mappings()
            return [dict(row) for row in rows]
    finally:
        engine.dispose()


def test_a_spawn_that_fails_twice_within_a_budget_of_three_runs_on_the_same_worker(
    any_cluster: Cluster, tmp_path: Path
) -> None:
    # Budget 3: the worker retries after each failed spawn and relays `final: false` twice; the
    # third spawn registers and runs the job there (docs/design/cluster.md §4.3). No second worker is needed.
    # A worker's retry also waits out its scaler's provision backoff (30 s, then 60 s by default),
    # which the re-armed window (backoff + window) must cover: short here, as docs/cluster.md says.
    script = tmp_path / "flaky_spawner.py"
    script.write_text(FLAKY_SPAWNER)
    config = json.loads(scalers_yaml(tmp_path / "flaky.yaml").read_text())
    config["scalers"][0]["command"] = [sys.executable, str(script), str(tmp_path / "attempts")]
    (tmp_path / "flaky.yaml").write_text(json.dumps(config))
    spawn = {
        "CONVEYOR_REROUTE_SPAWN_MAX_ATTEMPTS": "3",
        "CONVEYOR_REROUTE_SPAWN_RETRY_BACKOFF_MS": "200",
        "CONVEYOR_SCALER_PROVISION_BACKOFF_BASE_MS": "1000",
    }
    stage, (coordinator,), _worker = start(
        any_cluster,
        tmp_path,
        coordinator_env=spawn,
        worker_env={"CONVEYOR_SCALER_CONFIG": str(tmp_path / "flaky.yaml"), **spawn},
    )
    run_id = stage.push()
    job = stage.wait_run(run_id, "success", timeout=120)["jobs"][0]
    assert (job["rerouted_to"], job["reroute_hop"]) == ("w1", 1)
    assert (tmp_path / "attempts").read_text() == "3"
    relays = [entry["detail"] for entry in spawn_failures_in_timeline(coordinator, job["id"])]
    assert [(r["worker"], r["attempt"], r["final"]) for r in relays] == [("w1", 1, False), ("w1", 2, False)]
    assert "built on a worker's agent" in job_logs(stage, run_id, job["id"])


def test_a_worker_killed_while_holding_an_accepted_job_loses_it_to_the_other_worker(
    any_cluster: Cluster, tmp_path: Path
) -> None:
    # w1 ranks first (more scaler room) and accepts the job, but its agent never registers; killed with
    # the job accepted and not started, it loses the job to w2 by the flap grace's sweep (2 s), and the
    # job runs there exactly once (docs/design/cluster.md §4.3–§4.5). The spawn window stays long: a 5 s
    # one also bounded w2's own agent start, which a loaded machine took longer than, and took the job
    # back from w2 as well.
    stage, coordinator, workers = two_workers(any_cluster, tmp_path, NEVER_REGISTERS, {})
    try:
        run_id = stage.push()

        def held_by_w1() -> bool:
            jobs = stage.api("GET", f"/runs/{run_id}/jobs").json()["items"]
            return bool(jobs) and jobs[0]["rerouted_to"] == "w1" and jobs[0]["status"] != "running"

        wait_until(held_by_w1, timeout=60, what="w1 to accept the job")
        workers["w1"].kill9()
        job = stage.wait_run(run_id, "success", timeout=120)["jobs"][0]
        assert job["rerouted_to"] == "w2"
        assert applied_count(coordinator, job["id"]) == 1
        assert "built on a worker's agent" in job_logs(stage, run_id, job["id"])
    finally:
        for leftover in processes_under(workers["w1"].home):
            leftover.kill()


# One job only the worker can run (`linux`), one only the coordinator's own agent can (`here`); both
# wait for the gate.
FLAP_WORKFLOW = """
from conveyor import push, workflow
import pathlib, time

ci = workflow("ci", on=[push(branches=["main"])])

def wait_for_the_gate(ctx):
    ctx.sh(["echo", "started"])
    gate = pathlib.Path({gate!r})
    deadline = time.monotonic() + 120
    while not gate.exists() and time.monotonic() < deadline:
        time.sleep(0.05)

@ci.job(runs_on=["linux"])
def build(ctx):
    wait_for_the_gate(ctx)

@ci.job(runs_on=["here"])
def local(ctx):
    wait_for_the_gate(ctx)
"""


def set_cluster_knob(stage: Stage, name: str, value: int) -> None:
    answer = stage.api("PATCH", "/cluster-settings", json={name: value})
    assert answer.status_code == 200, answer.text
    assert answer.json()["effective"][name] == value


def jobs_by_name(stage: Stage, run_id: str) -> dict[str, dict[str, Any]]:
    return {job["name"]: job for job in stage.run(run_id)["jobs"]}


def silent_for_ms(node: Node, token: str, peer: str) -> int:
    """How long `node` has not heard from `peer`, 0 while it is connected."""
    (entry,) = [p for p in node.health(token)["peers"] if p["instance_id"] == peer]
    return 0 if entry["connected"] else int(entry["last_heartbeat_age_ms"] or 0)


def test_the_stale_run_sweep_defers_a_rerouted_job_within_the_flap_grace_only_and_never_a_local_one(
    any_cluster: Cluster, tmp_path: Path
) -> None:
    # docs/design/cluster.md §4.5: the sweep leaves a rerouted job alone while its worker was heard from
    # within `reroute_flap_grace_ms` (read live from the cluster settings, which beat the env default of 2 s),
    # and ends it `timed_out`, reason `stale`, once the worker has been silent for longer. A local job whose
    # agent died is never deferred: it is lost after the agents' dead-after, grace or not.
    gate = tmp_path / "gate"
    stage, (coordinator,), worker = start(
        any_cluster,
        tmp_path,
        FLAP_WORKFLOW.format(gate=str(gate)),
        via_proxy=True,
        coordinator_env={"CONVEYOR_AGENT_DEAD_AFTER_MS": "3000"},
    )
    set_cluster_knob(stage, "reroute_flap_grace_ms", 600_000)
    try:
        with agent_process(stage, tmp_path / "agent-home", labels="here") as agent:
            run_id = stage.push()

            def both_started() -> bool:
                jobs = jobs_by_name(stage, run_id)
                return all(
                    jobs[name]["status"] == "running"
                    and "started" in job_logs(stage, run_id, jobs[name]["id"])
                    for name in ("build", "local")
                )

            wait_until(both_started, timeout=120, what="both jobs to run")
            jobs = jobs_by_name(stage, run_id)
            assert jobs["build"]["rerouted_to"] == "w1" and jobs["local"]["rerouted_to"] is None

            any_cluster.cut_link(worker, coordinator)
            agent.kill()
            # The worker goes silent for longer than the env default grace and the agents' dead-after…
            wait_until(
                lambda: silent_for_ms(coordinator, any_cluster.token, "w1") > 4_000,
                timeout=60,
                what="the worker to be silent for 4 s",
            )
            # …and the sweep ends the local job (recovering, then lost after the recovery grace).
            local = wait_until(
                lambda: (job := jobs_by_name(stage, run_id)["local"])["status"] == "failed" and job,
                timeout=60,
                what="the local job to be lost",
            )
            assert local["reason"] == "agent_lost"
            # The rerouted job is within the grace of 10 min: left alone.
            build = jobs_by_name(stage, run_id)["build"]
            assert (build["status"], build["rerouted_to"]) == ("running", "w1")

            # A grace of 1 s, already exceeded: the next sweep ends the rerouted job.
            set_cluster_knob(stage, "reroute_flap_grace_ms", 1_000)
            build = wait_until(
                lambda: (job := jobs_by_name(stage, run_id)["build"])["status"] == "timed_out" and job,
                timeout=30,
                what="the rerouted job to time out stale",
            )
            assert build["reason"] == "stale" and build["rerouted_to"] is None
    finally:
        open_gate(gate)  # the worker's job and the killed agent's step end
