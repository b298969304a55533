"""End to end (docs/design/containers.md §7 scenario 7): a real server and a real `conveyor agent` run a
container job with a service on the test engine; the agent and its job's processes are SIGKILLed mid-job
(as a host crash or the kill of the agent's whole cgroup would), which leaves the job's containers and network
behind; the agent's next start sweeps them, found by the labels every job resource carries. (An agent killed
alone leaves its runner running, which removes what it started when it notices; that is not the case here.)"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from pathlib import Path

import pytest

from tests.support.agents import agent_process
from tests.support.dispatch_stage import stage
from tests.support.docker import DockerEngine, containers, networks
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow


def workflow(engine: DockerEngine) -> str:
    return f"""
from conveyor import Service, push, workflow

ci = workflow("ci", on=[push(branches=["main"])])

@ci.job(runs_on=["linux"], container="{engine.debian}",
        services={{"idle": Service("{engine.busybox}", command=["sleep", "600"])}})
def build(ctx):
    ctx.sh("echo in-the-container; sleep 600")
"""


@pytest.mark.timeout(300)
def test_the_agents_next_start_sweeps_what_a_killed_agents_job_left(
    database_url: str, tmp_path: Path, docker_engine: DockerEngine
) -> None:
    home = tmp_path / "agent-home"
    with stage(tmp_path, database_url, {"ci": workflow(docker_engine)}) as s:
        token = s.agent_token(["linux"])
        with agent_process(s, home, token=token, env={"DOCKER_HOST": docker_engine.host}) as agent:
            run_id = s.push()
            # The agent writes its id once it has started (imports included: seconds on a loaded machine).
            agent_id = wait_until(
                lambda: (home / "agent_id").read_text().strip(), timeout=60, what="the agent's id"
            )
            (job,) = s.api("GET", f"/runs/{run_id}/jobs").json()["items"]
            labels = ["conveyor.job-resource=true", f"conveyor.job={job['id']}", f"conveyor.agent={agent_id}"]
            wait_until(
                lambda: (
                    {c["Labels"]["conveyor.role"] for c in containers(docker_engine, labels)}
                    == {"job", "service"}
                ),
                timeout=120,
                what="the job container and its service",
            )

            # The runner's and the step's process groups, which the agent records for its next start
            # (`running.json`) once the step runs.
            def recorded_groups() -> list[int]:
                groups = json.loads((home / "running.json").read_text())["jobs"].get(job["id"], [])
                return list(groups) if len(groups) >= 2 else []

            groups = wait_until(recorded_groups, timeout=60, what="the step's process group in running.json")
            # Frozen first, as a host crash freezes them: a runner that outlived the agent by a moment would
            # notice its end and remove the containers itself, which is not what this test is about.
            for group in groups:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(group, signal.SIGSTOP)
            agent.kill()
            agent.wait(timeout=30)
            for group in groups:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(group, signal.SIGKILL)
        # Nothing removed them: everything that could have is dead.
        assert len(containers(docker_engine, labels)) == 2 and len(networks(docker_engine, labels)) == 1
        with agent_process(s, home, token=token, env={"DOCKER_HOST": docker_engine.host}):
            wait_until(
                lambda: not containers(docker_engine, labels) and not networks(docker_engine, labels),
                timeout=60,
                what="the sweep at the agent's start",
            )
