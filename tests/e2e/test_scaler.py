"""End to end: a real server whose bare-metal scaler spawns real `conveyor agent --ephemeral` processes.

No agent is started by hand in these tests: every job runs on an agent the scaler spawned, and every
test checks by pid and process group that nothing is left behind.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
import pytest
import websockets

from conveyor.model import protocol as p
from conveyor.scaler.config import builtin_local_max_agents
from tests.support.dispatch_stage import FAST, Stage, stage
from tests.support.processes import ServerProcess, clean_environ, conveyor_command, run_cli
from tests.support.repos import commit_all, git
from tests.support.scaler_e2e import (
    kill_leftover_agents,
    processes_under,
    scaler_env,
    scalers_yaml,
)
from tests.support.sql import query
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.skipif(sys.platform == "win32", reason="POSIX process groups")]


def workflow(step: str) -> str:
    return f"""
from conveyor import push, workflow

ci = workflow("ci", on=[push(branches=["main"])])

@ci.job(runs_on=["linux"])
def build(ctx):
    {step}
"""


@contextmanager
def scaled_stage(
    tmp_path: Path, database_url: str, step: str, env: dict[str, str] | None = None, **extra: Any
) -> Iterator[Stage]:
    (tmp_path / "scalers.yaml").write_text(scalers_yaml(**extra))
    environment = {**scaler_env(tmp_path), **(env or {})}
    with stage(tmp_path, database_url, {"ci": workflow(step)}, env=environment) as staged:
        try:
            yield staged
        finally:
            staged.server.stop()
            kill_leftover_agents(tmp_path)


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def group_alive(pgid: int) -> bool:
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(proc.pid) == pgid:
                return True
        except (ProcessLookupError, psutil.Error):
            continue
    return False


def cli(s: Stage, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(["admin", *args], env={"CONVEYOR_URL": s.server.url, "CONVEYOR_TOKEN": s.token})


def reuse_token(ws_url: str, token: str) -> tuple[Any, int | None]:
    """Present `token` again: the orchestrator's answer and its close code."""

    async def attempt() -> tuple[Any, int | None]:
        async with websockets.connect(ws_url) as sock:
            await sock.send(p.AuthRequest(token=token, version="test").model_dump_json())
            answer = p.parse_orchestrator_message(await sock.recv())
            try:
                await sock.recv()
            except websockets.ConnectionClosed as closed:
                return answer, closed.rcvd.code if closed.rcvd else None
            return answer, None

    return asyncio.run(attempt())


def scaler_status(s: Stage) -> dict[str, Any]:
    answer = s.api("GET", "/scaler/status")
    assert answer.status_code == 200, answer.text
    return answer.json()["scalers"][0]  # type: ignore[no-any-return]


def test_a_push_with_no_agent_spawns_one_that_runs_the_job_and_leaves_nothing(
    database_url: str, tmp_path: Path
) -> None:
    with scaled_stage(tmp_path, database_url, 'ctx.sh(["echo", "built by a spawned agent"])') as s:
        answer = s.api("GET", "/agents")
        assert answer.json()["items"] == []  # nobody started an agent
        run_id = s.push()
        run = s.wait_run(run_id, "success", timeout=120)
        (job,) = run["jobs"]
        wait_until(lambda: scaler_status(s)["active"] == 0, timeout=60, what="the spawned agent to be gone")
        # The history row is written when teardown finishes, which may follow the status change.
        wait_until(
            lambda: len(query(database_url, "SELECT * FROM scaler_spawn_history")) == 1,
            timeout=60,
            what="the spawn to reach the history",
        )
        (spawned,) = query(database_url, "SELECT * FROM scaler_spawn_history")
        assert spawned["outcome"] == "registered" and spawned["bound_job_id"] == job["id"]
        wait_until(
            lambda: query(database_url, "SELECT * FROM scaler_spawns") == [], timeout=60, what="no live spawn"
        )
        (agent,) = s.api("GET", "/agents").json()["items"]
        assert agent["agent_id"] == spawned["agent_id"] and agent["ephemeral"] is True
        assert job["agent_id"] == spawned["agent_id"]
        pid = int(spawned["backend_ref"])
        wait_until(
            lambda: not alive(pid) and not group_alive(pid),
            timeout=30,
            what="the agent's process group to end",
        )
        assert processes_under(tmp_path / "home" / "scaler") == []
        assert (
            "built by a spawned agent"
            in s.api(
                "GET", f"/runs/{run_id}/jobs/{job['id']}/logs", params={"offset": 0, "limit_bytes": 65536}
            ).json()["text"]
        )


def test_a_push_starts_an_agent_at_once_not_at_the_scalers_next_poll(
    database_url: str, tmp_path: Path
) -> None:
    """The enqueue wakes the scaler: with a 10 min poll, the job still gets its agent (issue 19, cold spawn)."""
    with scaled_stage(
        tmp_path, database_url, 'ctx.sh(["echo", "woken"])', env={"CONVEYOR_SCALER_POLL_MS": "600000"}
    ) as s:
        run_id = s.push()
        s.wait_run(run_id, "success", timeout=60)


def test_cancelling_a_job_whose_step_started_a_background_grandchild_leaves_nothing(
    database_url: str, tmp_path: Path
) -> None:
    marker = tmp_path / "sleep.pid"
    step = f'ctx.sh(["sh", "-c", "sleep 300 & echo $! > {marker}; wait"])'
    with scaled_stage(tmp_path, database_url, step) as s:
        run_id = s.push()
        wait_until(
            lambda: marker.exists() and marker.read_text().strip(), timeout=120, what="the step's sleep"
        )
        sleep_pid = int(marker.read_text())
        assert alive(sleep_pid)
        (spawn,) = query(database_url, "SELECT * FROM scaler_spawns")
        agent_pid = int(spawn["backend_ref"])
        # The spawned agent got a single-use token in its environment (never on argv); a second use is refused.
        environ = psutil.Process(agent_pid).environ()
        spawned_token = environ["CONVEYOR_AGENT_TOKEN"]
        assert environ["CONVEYOR_AGENT_ID"] == spawn["agent_id"]
        assert not any(spawned_token in arg for arg in psutil.Process(agent_pid).cmdline())
        failure, code = reuse_token(s.ws_url, spawned_token)
        assert isinstance(failure, p.AuthFailure) and failure.reason == "consumed"
        assert code == p.CLOSE_AUTH_FAILED
        answer = s.api("POST", f"/runs/{run_id}/cancel", json={"reason": "test"})
        assert answer.status_code == 202, answer.text
        s.wait_run(run_id, "cancelled", timeout=90)
        wait_until(lambda: scaler_status(s)["active"] == 0, timeout=60, what="the agent to be torn down")
        wait_until(lambda: not alive(sleep_pid), timeout=30, what="the background sleep to end")
        assert not alive(agent_pid) and not group_alive(agent_pid)
        assert processes_under(tmp_path / "home" / "scaler") == []


def test_a_failing_scaler_command_backs_off_and_a_fixed_reload_runs_the_job(
    database_url: str, tmp_path: Path
) -> None:
    missing = tmp_path / "no-such-agent"
    with scaled_stage(tmp_path, database_url, 'ctx.sh(["echo", "finally"])', command=[str(missing)]) as s:
        run_id = s.push()

        def failing() -> dict[str, Any] | None:
            status = scaler_status(s)
            return status if status["backoff"]["consecutive_failures"] >= 1 else None

        status = wait_until(failing, timeout=60, what="a provisioning failure")
        assert f"cannot start {missing}" in status["backoff"]["last_error"]
        shown = cli(s, "scaler", "status")
        assert shown.returncode == 0, shown.stderr
        assert "backoff:" in shown.stdout and f"cannot start {missing}" in shown.stdout

        def backoff_reason() -> dict[str, Any] | None:
            (job,) = s.run(run_id)["jobs"]
            return job if "provision backoff" in (job["reason"] or "") else None

        job = wait_until(backoff_reason, timeout=30, what="the backoff in the job's reason")
        assert job["status"] == "queued" and f"cannot start {missing}" in job["reason"]
        queue = cli(s, "--json", "queue", "list")
        (row,) = json.loads(queue.stdout)["items"]
        assert f"cannot start {missing}" in row["last_provisioning_error"]
        # An invalid file is refused and changes nothing.
        config = tmp_path / "scalers.yaml"
        config.write_text("version: 1\nscalers: [{name: local, type: bare-metal}]\n")
        refused = cli(s, "scaler", "reload")
        assert refused.returncode == 2 and "Traceback" not in refused.stderr
        assert "max_agents: required" in refused.stderr and "scaler_config_invalid" in refused.stderr
        assert "cannot start" in scaler_status(s)["backoff"]["last_error"]
        # The fixed file applies, and the job runs.
        config.write_text(scalers_yaml())
        reloaded = cli(s, "scaler", "reload")
        assert reloaded.returncode == 0, reloaded.stderr
        assert "reloaded: local" in reloaded.stdout
        s.wait_run(run_id, "success", timeout=120)
        wait_until(lambda: scaler_status(s)["active"] == 0, timeout=60, what="the agent to be gone")
        assert scaler_status(s)["backoff"]["consecutive_failures"] == 0
        assert processes_under(tmp_path / "home" / "scaler") == []


def test_a_restart_after_sigkill_ends_the_leftover_agent_of_the_older_boot(
    database_url: str, tmp_path: Path
) -> None:
    marker = tmp_path / "step.pid"
    step = f'ctx.sh(["sh", "-c", "echo $$ > {marker}; exec sleep 300"])'
    with scaled_stage(tmp_path, database_url, step) as s:
        run_id = s.push()
        wait_until(
            lambda: marker.exists() and marker.read_text().strip(), timeout=120, what="the step to run"
        )
        step_pid = int(marker.read_text())
        # The step can run before the orchestrator has recorded the agent's `job.started`; a job still
        # `dispatched` when its orchestrator dies is requeued, not failed, so wait for `running`.
        wait_until(
            lambda: [row["status"] for row in query(database_url, "SELECT status FROM jobs")] == ["running"],
            timeout=60,
            what="the job to be recorded running",
        )
        (spawn,) = query(database_url, "SELECT * FROM scaler_spawns")
        agent_pid = int(spawn["backend_ref"])
        s.server.kill()
        assert alive(agent_pid) and alive(step_pid)  # the agent survives its orchestrator
        restarted = ServerProcess(
            s.server.home, database_url=database_url, env=scaler_env(tmp_path), port=s.server.port
        )
        s.server = restarted
        restarted.wait_ready()
        wait_until(lambda: not alive(agent_pid), timeout=60, what="the leftover agent to end")
        wait_until(lambda: not alive(step_pid), timeout=30, what="the leftover step to end")
        assert not group_alive(agent_pid)
        logged = [
            json.loads(line)
            for line in restarted.output().splitlines()
            if line.startswith("{") and "ended leftover agent" in line
        ]
        assert logged and spawn["agent_id"] in logged[0]["msg"]
        assert logged[0]["level"] == "warning"
        (ended,) = query(database_url, "SELECT * FROM scaler_spawn_history")
        assert (ended["agent_id"], ended["outcome"]) == (spawn["agent_id"], "node_restarted")
        assert processes_under(tmp_path / "home" / "scaler") == []
        run = s.wait_run(run_id, "failed", timeout=60)  # its agent is gone: agent_lost after the grace
        assert run["jobs"][0]["reason"] == "agent_lost"


def test_conveyor_up_runs_an_init_workflow_with_no_agent(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    init = subprocess.run(
        conveyor_command("init"), cwd=repo, env=clean_environ(), capture_output=True, text=True, timeout=120
    )
    assert init.returncode == 0, init.stderr
    compiled = subprocess.run(
        conveyor_command("compile"),
        cwd=repo,
        env=clean_environ(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert compiled.returncode == 0, compiled.stderr
    commit_all(repo, "ci")
    server = ServerProcess(tmp_path / "home", env=dict(FAST), command="up")
    try:
        server.wait_ready()
        s = Stage(server, repo)
        s.add_source()
        (local,) = s.api("GET", "/scaler/status").json()["scalers"]
        assert local["name"] == "local" and local["type"] == "bare-metal"
        assert local["max_agents"] == builtin_local_max_agents(os.cpu_count())
        assert "local" in local["label_sets"][0] and any(
            label.startswith("conveyor:os:") for label in local["label_sets"][0]
        )
        run_id = s.push()
        run = s.wait_run(run_id, "success", timeout=180)
        assert [j["status"] for j in run["jobs"]] == ["success"]
        wait_until(
            lambda: s.api("GET", "/scaler/status").json()["scalers"][0]["active"] == 0,
            timeout=60,
            what="agent gone",
        )
        assert processes_under(tmp_path / "home" / "scaler") == []
    finally:
        server.stop()
        kill_leftover_agents(tmp_path)


def test_a_warm_pool_fills_with_real_agents_that_take_jobs(database_url: str, tmp_path: Path) -> None:
    warm = {"warm_pool": {"size": 1, "idle_timeout_s": 300}}
    with scaled_stage(tmp_path, database_url, 'ctx.sh(["echo", "warm"])', **warm) as s:

        def idle_warm_agent() -> str | None:
            if scaler_status(s)["warm_idle"] != 1:
                return None
            online = [a for a in s.api("GET", "/agents").json()["items"] if a["state"] == "online"]
            return online[0]["agent_id"] if len(online) == 1 else None

        first = wait_until(idle_warm_agent, timeout=60, what="a warm agent, registered and idle")
        assert query(database_url, "SELECT bound_job_id, warm FROM scaler_spawns") == [
            {"bound_job_id": None, "warm": True}
        ]
        run_id = s.push()
        run = s.wait_run(run_id, "success", timeout=120)
        assert run["jobs"][0]["agent_id"] == first  # the warm agent took the job
        spawned_for_jobs = query(
            database_url, "SELECT agent_id FROM scaler_spawn_history WHERE bound_job_id IS NOT NULL"
        )
        assert spawned_for_jobs == []  # no agent was spawned for the job itself
        second = wait_until(
            lambda: (agent := idle_warm_agent()) != first and agent, timeout=60, what="the pool to refill"
        )
        assert second and second != first
        s.server.stop()
        assert processes_under(tmp_path / "home" / "scaler") == []  # stopping the server ended the warm agent
