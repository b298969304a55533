"""End to end: a real git repository, a real `conveyor server`, a real `conveyor agent` process."""

import base64
import signal
from pathlib import Path

import pytest

from tests.support.agents import agent_process, assert_no_clear_secret, job_log, set_secret
from tests.support.dispatch_stage import FAST as FAST_ENV
from tests.support.dispatch_stage import stage
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

# A restarted orchestrator gives the jobs of agents not connected to it a full recovery grace
# (docs/design/execution.md §6): long enough here for the agent's reconnect backoff, so its outbox replay
# decides.
RESTART_ENV = {**FAST_ENV, "CONVEYOR_RECOVERY_GRACE_MS": "60000"}

WORKFLOW = """
import base64

from conveyor import push, workflow

ci = workflow("ci", on=[push(branches=["main"])])

@ci.job(runs_on=["linux"])
def build(ctx):
    ctx.sh(["echo", "$HOME"])
    key = ctx.secrets.get("DEPLOY_KEY")
    print("built with", key)
    print("encoded", base64.b64encode(key.encode()).decode())
    ctx.sh(["echo", "via sh", key])

@ci.job(runs_on=["linux"], needs=[build])
def test(ctx):
    ctx.sh(["echo", "tested"])
"""

FAILING = WORKFLOW.replace('ctx.sh(["echo", "$HOME"])', 'ctx.sh(["sh", "-c", "echo about to fail; exit 3"])')


def test_a_push_runs_on_a_real_agent_with_logs_and_masked_secrets(database_url: str, tmp_path: Path) -> None:
    with stage(tmp_path, database_url, {"ci": WORKFLOW}) as s:
        set_secret(s, "DEPLOY_KEY", "hunter2-very-secret")
        with agent_process(s, tmp_path / "agent-home"):
            run_id = s.push()
            run = s.wait_run(run_id, "success", timeout=120)
            build = next(j for j in run["jobs"] if j["name"] == "build")
            text = job_log(s, run_id, build["id"])
            assert "$HOME" in text  # argv, no shell: the literal string
            encoded = base64.b64encode(b"hunter2-very-secret").decode()
            assert "built with ***" in text and "via sh ***" in text
            assert "hunter2-very-secret" not in text and encoded not in text
            assert {j["status"] for j in run["jobs"]} == {"success"}
            assert_no_clear_secret(database_url, "hunter2-very-secret")
            assert_no_clear_secret(database_url, encoded)


def test_a_failing_step_fails_its_job_and_skips_the_dependants(database_url: str, tmp_path: Path) -> None:
    with stage(tmp_path, database_url, {"ci": FAILING}) as s:
        with agent_process(s, tmp_path / "agent-home"):
            run_id = s.push()
            run = s.wait_run(run_id, "failed", timeout=120)
            statuses = {j["name"]: (j["status"], j["reason"]) for j in run["jobs"]}
            assert statuses["build"][0] == "failed"
            assert statuses["test"] == ("skipped", "needs: build failed")


def test_an_agent_killed_mid_job_leaves_the_job_failed_after_the_grace(
    database_url: str, tmp_path: Path
) -> None:
    slow = WORKFLOW.replace('ctx.sh(["echo", "$HOME"])', 'ctx.sh(["sleep", "120"])')
    with stage(tmp_path, database_url, {"ci": slow}) as s:
        with agent_process(s, tmp_path / "agent-home") as proc:
            run_id = s.push()
            wait_until(lambda: s.job_status(run_id)["build"] == "running", timeout=120, what="build running")
            proc.kill()
            proc.wait()
            wait_until(
                lambda: s.job_status(run_id)["build"] in ("recovering", "failed"),
                timeout=30,
                what="recovering",
            )
            run = s.wait_run(run_id, "failed", timeout=60)
            build = next(j for j in run["jobs"] if j["name"] == "build")
            assert build["reason"] == "agent_lost"


def test_a_status_finished_while_the_orchestrator_was_down_is_applied_once_after_restart(
    database_url: str, tmp_path: Path
) -> None:
    slow = WORKFLOW.replace('ctx.sh(["echo", "$HOME"])', 'ctx.sh(["sleep", "4"])')
    with stage(tmp_path, database_url, {"ci": slow}) as s:
        set_secret(s, "DEPLOY_KEY", "another-secret-value")
        with agent_process(s, tmp_path / "agent-home"):
            run_id = s.push()
            wait_until(lambda: s.job_status(run_id)["build"] == "running", timeout=120, what="build running")
            s.server.kill()  # the job finishes while nobody listens; its status waits in the outbox
            outbox = tmp_path / "agent-home" / "outbox.jsonl"
            wait_until(
                lambda: outbox.exists() and '"job.finished"' in outbox.read_text(),
                timeout=60,
                what="outbox entry",
            )
            from tests.support.processes import ServerProcess

            restarted = ServerProcess(
                s.server.home, database_url=database_url, env=RESTART_ENV, port=s.server.port
            )
            s.server = restarted
            try:
                restarted.wait_ready()
                run = s.wait_run(run_id, "success", timeout=180)
                build = next(j for j in run["jobs"] if j["name"] == "build")
                assert build["status"] == "success"
                history = s.api("GET", f"/runs/{run_id}").json()
                assert [j["status"] for j in history["jobs"]].count("success") == 2
            finally:
                restarted.stop()


def test_both_killed_before_the_ack_apply_the_status_once_after_both_restart(
    database_url: str, tmp_path: Path
) -> None:
    slow = WORKFLOW.replace('ctx.sh(["echo", "$HOME"])', 'ctx.sh(["sleep", "4"])')
    with stage(tmp_path, database_url, {"ci": slow}) as s:
        set_secret(s, "DEPLOY_KEY", "both-killed-secret")
        home = tmp_path / "agent-home"
        with agent_process(s, home) as agent:
            run_id = s.push()
            wait_until(lambda: s.job_status(run_id)["build"] == "running", timeout=120, what="build running")
            s.server.kill()
            outbox = home / "outbox.jsonl"
            wait_until(
                lambda: outbox.exists() and '"job.finished"' in outbox.read_text(),
                timeout=60,
                what="outbox entry",
            )
            agent.kill()
            agent.wait()
        from tests.support.processes import ServerProcess

        restarted = ServerProcess(
            s.server.home, database_url=database_url, env=RESTART_ENV, port=s.server.port
        )
        s.server = restarted
        try:
            restarted.wait_ready()
            with agent_process(s, home, reuse_token=True):
                run = s.wait_run(run_id, "success", timeout=180)
            assert [j["status"] for j in run["jobs"]] == ["success", "success"]
            assert_no_clear_secret(database_url, "both-killed-secret")
        finally:
            restarted.stop()


def test_a_log_chunk_written_to_an_orchestrator_that_dies_unread_reaches_the_next_one(
    postgres_url: str, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    frozen_step = f"""
import os
import time

from conveyor import push, workflow

ci = workflow("ci", on=[push(branches=["main"])])

@ci.job(runs_on=["linux"])
def build(ctx):
    print("before the freeze", flush=True)
    while not os.path.exists({str(go)!r}):
        time.sleep(0.05)
    print("while frozen", flush=True)
"""
    with stage(tmp_path, postgres_url, {"ci": frozen_step}) as s:
        home = tmp_path / "agent-home"
        with agent_process(s, home):
            run_id = s.push()
            build_id = wait_until(
                lambda: next(
                    (
                        j["id"]
                        for j in s.run(run_id)["jobs"]
                        if j["name"] == "build" and "before the freeze" in job_log(s, run_id, j["id"])
                    ),
                    None,
                ),
                timeout=120,
                what="the first chunk stored",
            )
            # Frozen, the orchestrator reads nothing: the next chunk and the job's end go into its socket.
            s.server.signal(signal.SIGSTOP)
            go.touch()
            outbox = home / "outbox.jsonl"
            wait_until(
                lambda: outbox.exists() and '"job.finished"' in outbox.read_text(),
                timeout=60,
                what="the job's end in the outbox, after its last chunk was written",
            )
            s.server.kill()  # dies with both unread
            from tests.support.processes import ServerProcess

            restarted = ServerProcess(
                s.server.home, database_url=postgres_url, env=RESTART_ENV, port=s.server.port
            )
            s.server = restarted
            try:
                restarted.wait_ready()
                s.wait_run(run_id, "success", timeout=120)
                text = job_log(s, run_id, build_id)
                assert "before the freeze" in text and "while frozen" in text, text
                assert "missing" not in text, text
            finally:
                restarted.stop()
