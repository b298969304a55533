"""End to end: a real server whose container scaler starts the agent in a container of the test engine.

The agent is this checkout running on the Debian test image's own Python (tests/support/docker.py,
`agent_in_debian`), with host networking so that it reaches the test server on 127.0.0.1. No agent is
started by hand: the job runs in the container the scaler made, and the container is gone afterwards.
Containers another node left, found by their labels, are removed by the orphan handling: at boot for this
node's older boot, through `conveyor admin scaler orphans stop` for a node that is gone. One server per
database serves the module's tests; the leftovers are made before it boots.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.dispatch_stage import FAST, Stage, stage
from tests.support.docker import DockerEngine, agent_in_debian, containers, remove_containers, run_container
from tests.support.processes import run_cli
from tests.support.waiting import wait_until

# One worker takes the module, so its server is made once per database (--dist loadgroup).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("container-scaler-e2e")]

STEP = 'ctx.sh(["sh", "-c", "test -f /.dockerenv && echo in a container; grep ^VERSION_CODENAME /etc/os-release"])'
WORKFLOW = f"""
from conveyor import push, workflow

ci = workflow("ci", on=[push(branches=["main"])])

@ci.job(runs_on=["linux", "docker"])
def build(ctx):
    {STEP}
"""


def scalers_yaml(path: Path, engine: DockerEngine, tmp_path: Path) -> Path:
    label_set, volumes = agent_in_debian(engine, tmp_path)
    scaler = {
        "name": "docker",
        "type": "container",
        "max_agents": 1,
        "engine": engine.host,
        "network": "host",
        "volumes": volumes,
        "stop_timeout_s": 2,
        "label_sets": [{"labels": ["linux", "docker"], **label_set}],
    }
    path.write_text(json.dumps({"version": 1, "scalers": [scaler]}))  # JSON is YAML
    return path


def new_agent_id() -> str:
    return f"0190f3a2-0000-7000-8000-{uuid.uuid4().hex[:12]}"


@dataclass
class Scaled:
    """The module's server, the node id it was given, and the containers left for it before its boot."""

    stage: Stage
    node: str
    older: str  # an agent of this node's older boot
    stray: str  # an agent of a node that is gone
    gone: str


def leave(engine: DockerEngine, agent_id: str, node: str) -> None:
    """A managed agent container that node `node` left running (boot `boot-old`)."""
    labels = {
        "conveyor.managed": "true",
        "conveyor.node": node,
        "conveyor.boot": "boot-old",
        "conveyor.scaler": "docker",
        "conveyor.agent-id": agent_id,
    }
    config = {"Image": engine.busybox, "Cmd": ["sleep", "300"], "Labels": labels}
    run_container(engine, config, name=f"cvy-{agent_id}")


@pytest.fixture(scope="module")
def scaled(
    module_database_url: str, tmp_path_factory: pytest.TempPathFactory, docker_engine: DockerEngine
) -> Iterator[Scaled]:
    tmp_path = tmp_path_factory.mktemp("container-scaler")
    me, gone = f"node-{uuid.uuid4().hex[:12]}", f"gone-{uuid.uuid4().hex[:12]}"
    older, stray = new_agent_id(), new_agent_id()
    config = scalers_yaml(tmp_path / "scalers.yaml", docker_engine, tmp_path)
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "instance-id").write_text(me + "\n")  # the node's id, known before its first boot
    try:
        leave(docker_engine, older, me)
        leave(docker_engine, stray, gone)
        env = {**FAST, "CONVEYOR_SCALER_CONFIG": str(config)}
        with stage(tmp_path, module_database_url, {"ci": WORKFLOW}, env=env) as staged:
            yield Scaled(stage=staged, node=me, older=older, stray=stray, gone=gone)
    finally:
        remove_containers(docker_engine, [f"conveyor.node={me}"])
        remove_containers(docker_engine, [f"conveyor.node={gone}"])


def logs(s: Stage, run_id: str, job_id: str) -> str:
    answer = s.api("GET", f"/runs/{run_id}/jobs/{job_id}/logs", params={"offset": 0, "limit_bytes": 65536})
    return str(answer.json()["text"])


def orphans(s: Stage, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(
        ["admin", "scaler", "orphans", *args], env={"CONVEYOR_URL": s.server.url, "CONVEYOR_TOKEN": s.token}
    )


def status_of(s: Stage) -> dict[str, Any]:
    return s.api("GET", "/scaler/status").json()["scalers"][0]  # type: ignore[no-any-return]


def test_a_push_runs_its_job_in_an_agent_container_that_is_removed_afterwards(
    scaled: Scaled, docker_engine: DockerEngine
) -> None:
    s = scaled.stage
    run_id = s.push()
    run = s.wait_run(run_id, "success", timeout=180)
    (job,) = run["jobs"]
    agent_id = job["agent_id"]

    assert "in a container\nVERSION_CODENAME=bookworm" in logs(s, run_id, job["id"])
    (agent,) = [item for item in s.api("GET", "/agents").json()["items"] if item["agent_id"] == agent_id]
    assert agent["ephemeral"] is True
    wait_until(
        lambda: containers(docker_engine, [f"conveyor.agent-id={agent_id}"]) == [],
        timeout=60,
        what="the agent's container to be removed",
    )
    wait_until(lambda: status_of(s)["active"] == 0, timeout=60, what="the spawn to end")
    assert (status_of(s)["runtime"], status_of(s)["engine"]) == ("docker", docker_engine.host)


def test_left_containers_are_removed_at_boot_or_by_orphans_stop_found_by_their_labels(
    scaled: Scaled, docker_engine: DockerEngine
) -> None:
    s, stray = scaled.stage, scaled.stray
    # Ended during the boot, before the server answered: no wait needed.
    assert containers(docker_engine, [f"conveyor.agent-id={scaled.older}"]) == []
    listed = orphans(s, "list", "--json")
    assert listed.returncode == 0, listed.stderr
    items = {item["vm_id"]: item for item in json.loads(listed.stdout)["items"]}
    assert (items[stray]["state"], items[stray]["kind"], items[stray]["node_marker"]) == (
        "untracked",
        "container",
        scaled.gone,
    )
    assert scaled.older not in items

    stopped = orphans(s, "stop", stray)

    assert stopped.returncode == 0 and f"{stray}: stopped" in stopped.stdout, stopped.stdout
    assert containers(docker_engine, [f"conveyor.agent-id={stray}"]) == []
    again = json.loads(orphans(s, "list", "--json").stdout)["items"]
    assert stray not in {item["vm_id"] for item in again}
