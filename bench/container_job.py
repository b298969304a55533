"""A container job's first step against the same job on the host, p50; a service's start to healthy.

What `container=` costs a job before its first command has run (docs/design/containers.md §4): each sample
runs one job through the real runner (`JobProcess`, as `conveyor run local` and the agent do) whose single
step is `ctx.sh("true")`, and times the runner's `setup` start to that step's end. The setup covers the
drift check, the workflow's import and, for a container job, the job container's create and start (and its
network's, on a bridge); the step covers one exec instead of one host process. Three jobs, interleaved so a
loaded machine slows them alike: on the host, in the Debian test image with `network: "host"`, and in it on
its own bridge network. Each job goes to a runner started with `--wait` that has been ready for 1.5 s, as
the agent keeps one: its interpreter start, imports and step spares' start are not in the figure.

Service start to healthy: `JobContainers.start` of a job with one busybox `httpd` service whose `health_cmd`
fetches its page, from the create call to the first passing check; the removal is timed apart.

The engine is `--docker-host` (default `CONVEYOR_BENCH_DOCKER_HOST`, then `CONVEYOR_TEST_DOCKER_HOST`,
then `DOCKER_HOST`): `scripts/with-docker.sh .venv/bin/python -m bench.container_job` starts a private one
with the test images loaded. Target (issue 40): the first step at most 300 ms later with host networking.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

from bench.harness import Report, add_docker_host, arguments, docker_host, finish, percentile
from conveyor.agent.containers import JobContainers
from conveyor.agent.process import JobProcess, ReadyRunner
from conveyor.agent.spec import JobSpec, WorkflowRef
from conveyor.lockfile.compiler import compile_repository
from conveyor.lockfile.models import Lock

DEBIAN = "conveyor-test/debian:test"
BUSYBOX = "conveyor-test/busybox:test"
EXTRA_TARGET_MS = 300.0
SETTLE_S = 1.5  # how long a ready runner waits for its job here
JOBS = {
    "host": "on the host",
    "container_host_net": "container, host network",
    "container": "container, bridge",
}

WORKFLOW = """
from conveyor import Container, Service, push, workflow

ci = workflow("ci", on=push(branches=["main"]))

@ci.job(runs_on="linux")
def host(ctx):
    ctx.sh("true")

@ci.job(runs_on="linux", container=Container("{debian}", options={{"network": "host"}}))
def container_host_net(ctx):
    ctx.sh("true")

@ci.job(runs_on="linux", container="{debian}")
def container(ctx):
    ctx.sh("true")

@ci.job(runs_on="linux", services={{"web": Service(
    "{busybox}",
    command="echo ok > /www/index.html && exec httpd -f -p 80 -h /www",
    health_cmd="wget -q -O- http://127.0.0.1/",
    health_interval="100ms",
)}})
def service(ctx):
    ctx.sh("true")
"""


def compile_source(src: Path, debian: str, busybox: str) -> Lock:
    """The workflow above in `src/.conveyor/workflows/`, compiled."""
    workflows = src / ".conveyor" / "workflows"
    workflows.mkdir(parents=True)
    (workflows / "ci.py").write_text(textwrap.dedent(WORKFLOW.format(debian=debian, busybox=busybox)))
    result = compile_repository(src)
    if not result.ok or result.lock is None:
        raise SystemExit(f"the bench workflow does not compile: {[str(e) for e in result.errors]}")
    return result.lock


def spec_for(lock: Lock, job: str) -> JobSpec:
    (workflow,) = lock.workflows
    entry = next(item for item in workflow.jobs if item.name == job)
    job_id = f"bench-{job.replace('_', '-')}-{uuid.uuid4().hex[:8]}"
    return JobSpec.model_validate(
        {
            "job_id": job_id,
            "run_id": "bench",
            "workflow": WorkflowRef.of(workflow).model_dump(mode="json"),
            "job": entry.model_dump(mode="json", by_alias=True),
            "context": {"event": {"type": "push", "branch": "main"}, "run_id": "bench"},
            "local": True,
        }
    )


async def first_step_ms(spec: JobSpec, workspace: Path, env: dict[str, str]) -> float:
    """Setup start → the first step's end, in ms, for one run of `spec` (which must succeed)."""
    started = ended = None
    finished: dict[str, Any] = {}
    # As the agent does: the job goes to a runner started (and ready) before it, with its step spares.
    ready = ReadyRunner(env=env)
    ready.start()
    while ready.pid is None:  # noqa: ASYNC110 (a ReadyRunner has no event for its spawn)
        await asyncio.sleep(0.01)
    runner = await ready.take(wait_s=60)
    await ready.stop()
    # An agent's ready runner has waited for its job: its step spares are up by then (not yet, at `ready`).
    await asyncio.sleep(SETTLE_S)
    async for message in JobProcess(env=env).start(spec, workspace, ready=runner):
        if message["type"] == "step.started" and message.get("step_index") == 0:
            started = time.perf_counter()
        elif message["type"] == "step.finished" and message.get("step_index") == 1:
            ended = time.perf_counter()
        elif message["type"] == "job.finished":
            finished = message
    if finished.get("status") != "success" or started is None or ended is None:
        raise RuntimeError(f"job {spec.job.name} did not succeed: {finished}")
    return (ended - started) * 1000


async def service_ready_ms(lock: Lock, workspace: Path, engine: str) -> tuple[float, float]:
    """(create → healthy, remove) in ms for the `service` job's busybox httpd."""
    (workflow,) = lock.workflows
    entry = next(item for item in workflow.jobs if item.name == "service")
    containers = JobContainers(
        entry,
        job_id=f"bench-service-{uuid.uuid4().hex[:8]}",
        agent_id="bench",
        workspace=workspace,
        engine=engine,
        log=lambda text: None,
    )
    started = time.perf_counter()
    try:
        await containers.start()
        ready = (time.perf_counter() - started) * 1000
    finally:
        removing = time.perf_counter()
        await containers.remove()
    return ready, (time.perf_counter() - removing) * 1000


async def measure(engine: str, samples: int, debian: str, busybox: str) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in [*JOBS, "service", "service_remove"]}
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_")}
    env.update(DOCKER_HOST=engine, CONVEYOR_RUNNER_AGENT_ID="bench")
    with tempfile.TemporaryDirectory(prefix="conveyor-bench-container-job-") as directory:
        root = Path(directory)
        lock = compile_source(root / "source", debian, busybox)
        count = 0

        def workspace() -> Path:
            nonlocal count
            count += 1
            path = root / f"ws{count}"
            path.mkdir()
            (path / "src").symlink_to(root / "source", target_is_directory=True)
            return path

        for name in JOBS:  # warm-up: images in the page cache, the engine's first network
            await first_step_ms(spec_for(lock, name), workspace(), env)
        await service_ready_ms(lock, workspace(), engine)
        for _ in range(samples):
            for name in JOBS:
                times[name].append(await first_step_ms(spec_for(lock, name), workspace(), env))
            ready, removed = await service_ready_ms(lock, workspace(), engine)
            times["service"].append(ready)
            times["service_remove"].append(removed)
    return times


def main() -> None:
    parser = arguments(__doc__ or "", dialects=False)
    parser.add_argument("--samples", type=int, help="samples of each (default 20, --quick 5)")
    add_docker_host(parser)
    parser.add_argument("--debian", default=DEBIAN, help=f"the job image (default {DEBIAN})")
    parser.add_argument("--busybox", default=BUSYBOX, help=f"the service image (default {BUSYBOX})")
    args = parser.parse_args()
    engine = docker_host(args)
    samples = args.samples or (5 if args.quick else 20)
    report = Report("container_job")
    print(f"== container_job: {samples} interleaved samples at {engine}", flush=True)
    times = asyncio.run(measure(engine, samples, args.debian, args.busybox))
    host = percentile(times["host"], 50)
    report.add(
        "container_job baseline: first step on the host p50", host, "ms", note="setup start to step end"
    )
    for name in ("container_host_net", "container"):
        value = percentile(times[name], 50)
        report.add(f"container_job: first step, {JOBS[name]} p50", value, "ms")
        extra = value - host
        if name == "container_host_net":
            report.add(
                f"container_job: {JOBS[name]} - host",
                extra,
                "ms",
                target=f"<= {EXTRA_TARGET_MS:g} ms",
                met=extra <= EXTRA_TARGET_MS,
            )
        else:
            report.add(f"container_job: {JOBS[name]} - host", extra, "ms")
    report.add("container_job: service start to healthy p50", percentile(times["service"], 50), "ms")
    report.add("container_job: service start to healthy p90", percentile(times["service"], 90), "ms")
    report.add(
        "container_job: service remove p50",
        percentile(times["service_remove"], 50),
        "ms",
        note="after the job",
    )
    finish(report, args)


if __name__ == "__main__":
    main()
