"""Container start through the Docker Engine API with host networking, p50, against a host process start.

What a container job or a container scaler's agent pays before its first instruction runs, beyond a
process on the host. Each sample creates, starts and waits for a container of the busybox test image that
runs `true` on the host network (`POST /containers/create`, `/start`, `/wait`, through aiodocker as the
scaler does); the baseline starts `true` of the same busybox binary as a host process and waits for it.
Samples are interleaved, so a loaded machine slows both alike. Removing the container is timed apart
(it is paid after the job, not before its first step).

The engine is `--docker-host` (default `CONVEYOR_BENCH_DOCKER_HOST`, then `CONVEYOR_TEST_DOCKER_HOST`,
then `DOCKER_HOST`): `scripts/with-docker.sh .venv/bin/python -m bench.container_start` starts a private
one with the test images loaded (`make bench` does). Target (issue 40): at most 300 ms more than the host.
"""

from __future__ import annotations

import asyncio
import shutil
import time

import aiodocker

from bench.harness import Report, add_docker_host, arguments, docker_host, finish, percentile

IMAGE = "conveyor-test/busybox:test"
EXTRA_TARGET_MS = 300.0


async def _host_process(command: list[str]) -> float:
    started = time.perf_counter()
    process = await asyncio.create_subprocess_exec(*command)
    if await process.wait() != 0:
        raise RuntimeError(f"{command} failed")
    return (time.perf_counter() - started) * 1000


async def _container(docker: aiodocker.Docker, image: str) -> tuple[float, float]:
    """(create → exit, remove) in ms for one `true` container on the host network."""
    config = {
        "Image": image,
        "Cmd": ["true"],
        "HostConfig": {"NetworkMode": "host"},
        "Labels": {"conveyor.bench": "container_start"},
    }
    started = time.perf_counter()
    container = await docker.containers.create(config)
    try:
        await container.start()
        status = await container.wait()
        ran = (time.perf_counter() - started) * 1000
        if status.get("StatusCode") != 0:
            raise RuntimeError(f"the container exited {status}")
    finally:
        removing = time.perf_counter()
        await container.delete(force=True)
    return ran, (time.perf_counter() - removing) * 1000


def baseline_command() -> list[str]:
    """`busybox true` (the binary the image runs) when the host has busybox, else the host's `true`."""
    busybox = shutil.which("busybox")
    return [busybox, "true"] if busybox else [shutil.which("true") or "/bin/true"]


async def measure(host: str, image: str, samples: int, baseline: list[str]) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {"host": [], "container": [], "remove": []}
    async with aiodocker.Docker(url=host) as docker:
        await docker.images.inspect(image)  # fails early, naming the image, when it is not loaded
        await _container(docker, image)  # warm the engine's caches and the page cache
        await _host_process(baseline)
        for _ in range(samples):
            times["host"].append(await _host_process(baseline))
            ran, removed = await _container(docker, image)
            times["container"].append(ran)
            times["remove"].append(removed)
    return times


def main() -> None:
    parser = arguments(__doc__ or "", dialects=False)
    parser.add_argument("--samples", type=int, help="samples of each (default 40, --quick 10)")
    add_docker_host(parser)
    parser.add_argument("--image", default=IMAGE, help=f"an image with `true` (default {IMAGE})")
    args = parser.parse_args()
    engine = docker_host(args)
    samples = args.samples or (10 if args.quick else 40)
    report = Report("container_start")
    print(f"== container_start: {samples} interleaved samples at {engine}", flush=True)
    times = asyncio.run(measure(engine, args.image, samples, baseline_command()))
    host = percentile(times["host"], 50)
    container = percentile(times["container"], 50)
    report.add("container_start baseline: host process start to exit p50", host, "ms", note="same run")
    report.add("container_start: create + start to exit, host network, p50", container, "ms")
    report.add("container_start: p90", percentile(times["container"], 90), "ms")
    extra = container - host
    report.add(
        "container_start: container - host process",
        extra,
        "ms",
        target=f"<= {EXTRA_TARGET_MS:g} ms",
        met=extra <= EXTRA_TARGET_MS,
    )
    report.add("container_start: container / host process", container / host, "x")
    report.add("container_start: remove p50", percentile(times["remove"], 50), "ms", note="after the job")
    finish(report, args)


if __name__ == "__main__":
    main()
