"""Container jobs and services through `conveyor run local` on the test run's real engine
(docs/design/containers.md §7, scenarios 1–6). Each test labels its resources with an agent id of its own, so
the check that nothing is left looks at its own jobs only."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.integration.agent.conftest import GIT_ENV, KILL_GRACE_MS
from tests.support.docker import DockerEngine, _client, containers, networks, remove_containers, run_container
from tests.support.waiting import wait_until

CONVEYOR = str(Path(sys.executable).with_name("conveyor"))
pytestmark = pytest.mark.slow


class LocalRepo:
    """A git repository with one workflow, run with `conveyor run local` against the test engine."""

    def __init__(self, root: Path, engine: DockerEngine) -> None:
        self.root = root
        self.engine = engine
        self.agent_id = f"test-{uuid.uuid4().hex[:12]}"
        self.labels = ["conveyor.job-resource=true", f"conveyor.agent={self.agent_id}"]

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_")}
        env.update(
            GIT_ENV,
            HOME=str(self.root.parent),
            TMPDIR=str(self.root.parent),
            CONVEYOR_KILL_GRACE_MS=KILL_GRACE_MS,
            DOCKER_HOST=self.engine.host,
            CONVEYOR_RUNNER_AGENT_ID=self.agent_id,
        )
        return env

    def write(self, source: str) -> None:
        workflows = self.root / ".conveyor" / "workflows"
        workflows.mkdir(parents=True)
        (workflows / "ci.py").write_text(textwrap.dedent(source))
        for argv in (["git", "init", "-q", "-b", "main"], [CONVEYOR, "compile"], ["git", "add", "-A"]):
            subprocess.run(argv, cwd=self.root, env=self.env(), check=True, capture_output=True)
        subprocess.run(["git", "commit", "-qm", "ci"], cwd=self.root, env=self.env(), check=True)

    def command(self, *args: str) -> list[str]:
        return [CONVEYOR, "run", "local", "push", "--json", "--secret", "TOKEN=s3cr3t-value-42", *args]

    def run(self, *args: str) -> list[dict[str, Any]]:
        done = subprocess.run(
            self.command(*args), cwd=self.root, env=self.env(), capture_output=True, text=True, timeout=180
        )
        return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]

    def leftovers(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        return containers(self.engine, self.labels), networks(self.engine, self.labels)


def log_text(records: list[dict[str, Any]], job: str) -> str:
    return "\n".join(r["text"] for r in records if r.get("kind") == "log" and r.get("job") == job)


def finished(records: list[dict[str, Any]], job: str) -> dict[str, Any]:
    return next(r for r in records if r.get("kind") == "job" and r.get("job") == job)


def step_finished(records: list[dict[str, Any]], job: str, step: str) -> dict[str, Any]:
    return next(
        r
        for r in records
        if r.get("kind") == "step"
        and r.get("event") == "step.finished"
        and r.get("job") == job
        and r.get("step") == step
    )


@pytest.fixture
def local_repo(tmp_path: Path, docker_engine: DockerEngine) -> LocalRepo:
    (tmp_path / "repo").mkdir()
    return LocalRepo(tmp_path / "repo", docker_engine)


def test_container_jobs_run_inside_mask_secrets_fail_with_the_code_stop_commands_and_use_services(
    local_repo: LocalRepo, docker_engine: DockerEngine
) -> None:
    local_repo.write(
        f"""
        from conveyor import Container, Service, push, workflow

        ci = workflow("ci", on=push(branches=["main"]))
        WEB = Service(
            "{docker_engine.busybox}",
            command="echo served-by-web > /www/index.html && exec httpd -f -p 80 -h /www",
            health_cmd="wget -q -O- http://127.0.0.1/",
        )

        @ci.job(runs_on="linux", container=Container("{docker_engine.debian}", env={{"FROM_IMAGE": "yes"}}))
        def inside(ctx):
            ctx.sh("cat /etc/os-release")
            ctx.sh("echo from-image=$FROM_IMAGE home=$HOME")
            ctx.secrets.expose("TOKEN")
            ctx.sh("echo token=$TOKEN")
            ctx.sh("echo written-inside > made-in-container.txt")
            assert (ctx.workspace / "made-in-container.txt").read_text() == "written-inside\\n"

        @ci.job(runs_on="linux", container="{docker_engine.debian}")
        def failing(ctx):
            ctx.sh("echo about to fail; exit 3")

        @ci.job(runs_on="linux", container="{docker_engine.debian}", services={{"web": WEB}})
        def service(ctx):
            ctx.sh("python3 -c \\"import urllib.request; print(urllib.request.urlopen('http://web/').read().decode())\\"")

        @ci.job(runs_on="linux", services={{"web": Service("{docker_engine.busybox}", ports=["{{port}}:80"],
                command="echo on-the-host > /www/index.html && exec httpd -f -p 80 -h /www",
                health_cmd="wget -q -O- http://127.0.0.1/")}})
        def host_with_service(ctx):
            import urllib.request
            print(urllib.request.urlopen("http://127.0.0.1:{{port}}/").read().decode())

        stopped = ci.job("stopped", runs_on="linux", container="{docker_engine.debian}")

        @stopped.step(timeout="2s", continue_on_error=True)
        def runs_long(ctx):
            ctx.sh("trap 'echo got-term > term-marker; exit 0' TERM; sleep 600 & wait")

        @stopped.step
        def check(ctx):
            ctx.sh("for i in $(seq 100); do [ -f term-marker ] && break; sleep 0.1; done; cat term-marker")

        @ci.job(runs_on="linux", container="{docker_engine.debian}", services={{"db": Service(
            "{docker_engine.busybox}", command="echo db-starting; exec sleep 600", health_cmd="false",
            health_interval="200ms", health_timeout="2s")}})
        def unhealthy(ctx):
            print("never runs")
        """.replace("{port}", str(_free_port()))
    )
    records = local_repo.run("--label", "linux")
    assert finished(records, "inside")["status"] == "success", log_text(records, "inside")
    inside = log_text(records, "inside")
    assert "VERSION_CODENAME=bookworm" in inside
    assert "from-image=yes home=/root" in inside
    assert "token=***" in inside and "s3cr3t-value-42" not in json.dumps(records)

    failing = step_finished(records, "failing", "failing")
    assert failing["status"] == "failed"
    assert "command exited with code 3" in (failing.get("error") or ""), failing
    assert "about to fail" in log_text(records, "failing")
    assert finished(records, "failing")["status"] == "failed"

    assert finished(records, "service")["status"] == "success", log_text(records, "service")
    assert "served-by-web" in log_text(records, "service")
    assert finished(records, "host_with_service")["status"] == "success", log_text(
        records, "host_with_service"
    )
    assert "on-the-host" in log_text(records, "host_with_service")

    # A step stopped on the host (its timeout) stops its command in the container too.
    assert step_finished(records, "stopped", "runs_long")["status"] == "timed_out"
    assert finished(records, "stopped")["status"] == "success", log_text(records, "stopped")
    assert "got-term" in log_text(records, "stopped")

    unhealthy = finished(records, "unhealthy")
    assert (unhealthy["status"], unhealthy["reason"]) == ("failed", "service_unhealthy"), unhealthy
    assert "service 'db' did not become healthy within 2s" in unhealthy["error"]
    assert "db-starting" in unhealthy["error"]
    assert "never runs" not in log_text(records, "unhealthy")

    assert local_repo.leftovers() == ([], [])


def _free_port() -> int:
    from tests.support.processes import free_port

    return free_port()


def test_timeout_and_cancel_remove_the_jobs_containers_and_network(
    local_repo: LocalRepo, docker_engine: DockerEngine
) -> None:
    local_repo.write(
        f"""
        from conveyor import Service, push, workflow

        ci = workflow("ci", on=push(branches=["main"]))
        IDLE = Service("{docker_engine.busybox}", command=["sleep", "600"])

        @ci.job(runs_on="linux", container="{docker_engine.debian}", services={{"idle": IDLE}}, timeout="3s")
        def slow(ctx):
            ctx.sh("sleep 600")

        @ci.job(runs_on="linux", container="{docker_engine.debian}", services={{"idle": IDLE}})
        def cancelled(ctx):
            ctx.sh("echo waiting-for-cancel; sleep 600")
        """
    )
    records = local_repo.run("--label", "linux", "--job", "slow")
    slow = finished(records, "slow")
    assert (slow["status"], slow["reason"]) == ("timed_out", "job_timeout"), slow
    assert local_repo.leftovers() == ([], [])

    process = subprocess.Popen(
        local_repo.command("--label", "linux", "--job", "cancelled"),
        cwd=local_repo.root,
        env=local_repo.env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        wait_until(
            lambda: len(containers(docker_engine, local_repo.labels)) == 2,
            timeout=60,
            what="the job container and its service",
        )
        for line in process.stdout:
            if "waiting-for-cancel" in line:
                break
        process.send_signal(signal.SIGINT)
        output = process.stdout.read()
        assert process.wait(timeout=60) != 0
    finally:
        if process.poll() is None:
            process.kill()
    cancelled = finished(
        [json.loads(line) for line in output.splitlines() if line.startswith("{")], "cancelled"
    )
    assert cancelled["status"] == "cancelled", cancelled
    assert local_repo.leftovers() == ([], [])


def test_run_local_removes_what_killed_local_runs_on_this_host_left_and_nothing_else(
    local_repo: LocalRepo, docker_engine: DockerEngine
) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid no runner has any more
    host = socket.gethostname()
    dead, alive = f"local-{host}-{gone.pid}", f"local-{host}-{os.getpid()}"
    for agent in (dead, alive):
        labels = {"conveyor.job-resource": "true", "conveyor.agent": agent, "conveyor.role": "job"}
        run_container(
            docker_engine,
            {"Image": docker_engine.busybox, "Cmd": ["sleep", "600"], "Labels": labels},
            name=f"cvy-job-test-{uuid.uuid4().hex[:10]}",
        )
        with _client(docker_engine.host) as client:
            client.post(
                "/networks/create",
                json={
                    "Name": f"cvy-job-test-{uuid.uuid4().hex[:10]}",
                    "Labels": {**labels, "conveyor.role": "network"},
                },
            ).raise_for_status()
    try:
        local_repo.write(
            f"""
            from conveyor import push, workflow

            ci = workflow("ci", on=push(branches=["main"]))

            @ci.job(runs_on="linux", container="{docker_engine.debian}")
            def inside(ctx):
                ctx.sh("true")
            """
        )
        records = local_repo.run("--label", "linux")
        assert finished(records, "inside")["status"] == "success", log_text(records, "inside")
        for agent, left in ((dead, 0), (alive, 1)):
            labels = ["conveyor.job-resource=true", f"conveyor.agent={agent}"]
            assert (len(containers(docker_engine, labels)), len(networks(docker_engine, labels))) == (
                left,
                left,
            )
    finally:
        for agent in (dead, alive):
            labels = ["conveyor.job-resource=true", f"conveyor.agent={agent}"]
            remove_containers(docker_engine, labels)
            with _client(docker_engine.host) as client:
                for network in networks(docker_engine, labels):
                    client.delete(f"/networks/{network['Id']}")
