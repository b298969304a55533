"""A container job's network, services and job container start while its checkout runs
(docs/design/containers.md §4): when the checkout then fails, the runner waits for what was being started
and removes all of it, on the test run's real engine."""

from __future__ import annotations

import asyncio
import json
import os
import textwrap
import uuid
from pathlib import Path
from typing import Any

import aiodocker
import pytest

from conveyor.agent.process import JobProcess
from conveyor.agent.spec import JobSpec, WorkflowRef
from conveyor.lockfile.compiler import compile_repository
from tests.support.docker import DockerEngine

pytestmark = pytest.mark.slow

WORKFLOW = """
from conveyor import Container, Service, push, workflow

ci = workflow("ci", on=push(branches=["main"]))

@ci.job(
    runs_on="linux",
    container="{debian}",
    services={{"web": Service("{busybox}", command="exec sleep 600", health_cmd="false",
                              health_timeout="120s")}},
)
def build(ctx):
    ctx.sh("true")
"""


def container_job_spec(root: Path, engine: DockerEngine, clone_url: str) -> JobSpec:
    """The job above, to be checked out from `clone_url`."""
    workflows = root / ".conveyor" / "workflows"
    workflows.mkdir(parents=True)
    source = WORKFLOW.format(debian=engine.debian, busybox=engine.busybox)
    (workflows / "ci.py").write_text(textwrap.dedent(source))
    result = compile_repository(root)
    assert result.ok and result.lock is not None, result.errors
    (workflow,) = result.lock.workflows
    (entry,) = workflow.jobs
    return JobSpec.model_validate(
        {
            "job_id": f"test-checkout-fails-{uuid.uuid4().hex[:8]}",
            "run_id": "test",
            "repo": {"clone_url": clone_url, "sha": "0" * 40},
            "workflow": WorkflowRef.of(workflow).model_dump(mode="json"),
            "job": entry.model_dump(mode="json", by_alias=True),
            "context": {"event": {"type": "push", "branch": "main"}, "run_id": "test"},
        }
    )


async def test_a_checkout_failing_after_the_containers_started_removes_them(
    tmp_path: Path, docker_engine: DockerEngine, docker: aiodocker.Docker
) -> None:
    # A git server that holds its first request until the job's containers are up, then hangs up on it.
    release = asyncio.Event()
    requested = asyncio.Event()

    async def hold_then_hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        requested.set()
        await release.wait()
        writer.close()

    server = await asyncio.start_server(hold_then_hang_up, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    agent_id = f"test-{uuid.uuid4().hex[:12]}"
    spec = container_job_spec(tmp_path / "source", docker_engine, f"http://127.0.0.1:{port}/repo.git")
    filters = json.dumps({"label": ["conveyor.job-resource=true", f"conveyor.agent={agent_id}"]})
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_")}
    env.update(DOCKER_HOST=docker_engine.host, CONVEYOR_RUNNER_AGENT_ID=agent_id, GIT_TERMINAL_PROMPT="0")
    workspace = tmp_path / "work"
    workspace.mkdir()
    messages: list[dict[str, Any]] = []

    async def run_job() -> None:
        async for message in JobProcess(env=env).start(spec, workspace):
            messages.append(message)

    job = asyncio.create_task(run_job())
    try:
        await asyncio.wait_for(requested.wait(), 60)
        # The checkout is waiting on the server: the job container and the service start meanwhile.
        async with asyncio.timeout(60):
            while True:
                running = await docker.containers.list(filters=filters)
                roles = sorted(c._container["Labels"]["conveyor.role"] for c in running)
                if roles == ["job", "service"]:
                    break
                await asyncio.sleep(0.05)
        assert not job.done()
        release.set()
        await asyncio.wait_for(job, 60)  # well within the service's 120 s health timeout
    finally:
        release.set()
        server.close()
        job.cancel()
    done = next(m for m in messages if m["type"] == "job.finished")
    assert (done["status"], done["reason"]) == ("failed", "checkout_failed")
    assert await docker.containers.list(all="1", filters=filters) == []
    assert (
        await docker.networks.list(
            filters={"label": ["conveyor.job-resource=true", f"conveyor.agent={agent_id}"]}
        )
        == []
    )
