"""A container job's engine resources: the per-job network, the services, the job container; their removal
and the start-up sweep (docs/design/containers.md §4–§6).

The runner owns a `JobContainers` for each job that has `container=` or `services=`; it talks to the engine
through the Engine API (aiodocker), never through a CLI. The pure half (configs, labels, messages) is
`container_plan.py`; this module is the I/O edge, imported only when a job or the sweep needs it.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiodocker
import psutil

from conveyor.agent.container_plan import (
    AGENT_LABEL,
    LOG_TAIL,
    RESOURCE_LABEL,
    STATE_POLL_S,
    ContainerFailed,
    JobContainer,
    dead_local_agents,
    image_path,
    job_container_config,
    resource_labels,
    resource_name,
    seconds,
    service_config,
    service_failure,
    signal_commands_argv,
    workspace_binds,
)
from conveyor.lockfile.models import ContainerEntry, JobEntry, ServiceEntry

# --- the engine ------------------------------------------------------------------------------------------


class JobContainers:
    """The network, services and job container of one job: started in `start`, removed in `remove`."""

    def __init__(
        self,
        job: JobEntry,
        *,
        job_id: str,
        agent_id: str,
        workspace: Path,
        engine: str,
        log: Callable[[str], None],
        stopped: Callable[[], bool] = lambda: False,
        pull_gate: asyncio.Event | None = None,
    ) -> None:
        self.job = job
        self.job_id = job_id
        self.agent_id = agent_id
        self.workspace = workspace
        self.engine = engine
        self.log = log
        self.stopped = stopped
        self.pull_gate = pull_gate
        self.network: str | None = None
        self.job_container_id: str | None = None
        self.started: list[str] = []  # container ids, in start order
        self._docker: aiodocker.Docker | None = None

    def _client(self) -> aiodocker.Docker:
        if self._docker is None:
            self._docker = aiodocker.Docker(url=self.engine)
        return self._docker

    async def start(self) -> JobContainer | None:
        """Network, services (waited for), then the job container; None when the job runs on the host."""
        try:
            return await self._start()
        except aiodocker.DockerError as error:
            raise ContainerFailed("container_failed", f"container engine: {error.message}") from None
        except (TimeoutError, OSError) as error:
            raise ContainerFailed(
                "container_failed", f"container engine at {self.engine} did not answer: {error!r}"
            ) from None

    async def _start(self) -> JobContainer | None:
        docker = self._client()
        container = self.job.container
        host_network = container is not None and container.options.get("network") == "host"
        if host_network:
            network = "host"
        else:
            network = resource_name(self.job_id)
            await docker.networks.create(
                {
                    "Name": network,
                    "Driver": "bridge",
                    "CheckDuplicate": True,
                    "Labels": resource_labels(self.job_id, self.agent_id, "network"),
                }
            )
            self.network = network
            self.log(f"network {network} created")
        # Every service starts at once, and the job container while they become healthy: each engine call
        # is a round trip that the others need not wait for (the job's steps still wait for every check).
        started = await asyncio.gather(
            *(self._start_service(name, entry, network) for name, entry in self.job.services.items()),
            return_exceptions=True,  # every create has answered (and its id is kept) before a failure is told
        )
        services = []
        for result in started:
            if isinstance(result, BaseException):
                raise result
            services.append(result)
        job_container = None
        if container is not None:
            job_container = asyncio.ensure_future(self._start_job_container(container, network))
        try:
            for name, entry, created in services:
                await self._wait_ready(name, entry, created)
        except BaseException:
            if job_container is not None:  # its id must be known (and removed) before the failure is told
                await asyncio.wait({job_container})
                if not job_container.cancelled():
                    job_container.exception()
            raise
        return None if job_container is None else await job_container

    async def _start_service(
        self, name: str, entry: ServiceEntry, network: str
    ) -> tuple[str, ServiceEntry, aiodocker.docker.DockerContainer]:
        labels = resource_labels(self.job_id, self.agent_id, "service", name)
        created = await self._create(
            service_config(name, entry, labels, network), resource_name(self.job_id, name), entry.image
        )
        self.started.append(created.id)
        await created.start()
        self.log(f"service {name} ({entry.image}) started")
        return name, entry, created

    async def _start_job_container(self, container: ContainerEntry, network: str) -> JobContainer:
        # The workspace exists before the checkout begins, so the container can start while it runs; the
        # working directory is the workspace because `src` may not exist yet (each exec sets its own).
        config = job_container_config(
            container,
            binds=workspace_binds(self.workspace),
            workdir=str(self.workspace),
            labels=resource_labels(self.job_id, self.agent_id, "job"),
            network=network,
        )
        created = await self._create(config, resource_name(self.job_id, "job"), container.image)
        self.started.append(created.id)
        self.job_container_id = created.id
        # The image's PATH is read while the container starts: the create proved the image is there.
        _, inspected = await asyncio.gather(created.start(), self._client().images.inspect(container.image))
        self.log(f"job container ({container.image}) started")
        user = container.options.get("user")
        return JobContainer(
            self.engine, created.id, image_path(dict(inspected)), None if user is None else str(user)
        )

    async def _create(
        self, config: dict[str, Any], name: str, image: str
    ) -> aiodocker.docker.DockerContainer:
        """Create a container, pulling its image first only when the engine lacks it (the create says so)."""
        docker = self._client()
        try:
            return await docker.containers.create(config, name=name)
        except aiodocker.DockerError as error:
            if error.status != 404 or await self._has_image(image):
                raise
        await self._pull(image)
        return await docker.containers.create(config, name=name)

    async def _has_image(self, image: str) -> bool:
        try:
            await self._client().images.inspect(image)
        except aiodocker.DockerError as error:
            if error.status != 404:
                raise
            return False
        return True

    async def _pull(self, image: str) -> None:
        # A job whose lock turns out to be out of date pulls nothing: the runner opens the gate after the
        # drift check (the containers start while the checkout runs).
        if self.pull_gate is not None:
            await self.pull_gate.wait()
        if self.stopped():
            raise ContainerFailed("cancelled", f"stopped before pulling {image}")
        self.log(f"pulling {image}")
        started = time.monotonic()
        await self._client().images.pull(image)
        self.log(f"pulled {image} in {time.monotonic() - started:.1f}s")

    async def _wait_ready(
        self, name: str, entry: ServiceEntry, container: aiodocker.docker.DockerContainer
    ) -> None:
        """Until `health_cmd` exits 0 inside the service (run now, then every interval), or it is running."""
        deadline = time.monotonic() + entry.health_timeout_ms / 1000
        started = time.monotonic()
        next_check = started
        while True:
            if self.stopped():
                raise ContainerFailed("cancelled", f"stopped while waiting for service {name!r}")
            state = (await container.show()).get("State") or {}
            if not state.get("Running"):
                why = f"exited with code {state.get('ExitCode')} before it became ready"
                raise ContainerFailed(
                    "service_unhealthy", service_failure(name, why, await self._tail(container))
                )
            if entry.health_cmd is None:
                self.log(f"service {name} is running (no health_cmd)")
                return
            now = time.monotonic()
            if now >= next_check:
                if await self._healthy(container, entry.health_cmd):
                    self.log(f"service {name} healthy after {time.monotonic() - started:.2f}s")
                    return
                next_check = time.monotonic() + entry.health_interval_ms / 1000
            if time.monotonic() >= deadline:
                why = f"did not become healthy within {seconds(entry.health_timeout_ms)}"
                raise ContainerFailed(
                    "service_unhealthy", service_failure(name, why, await self._tail(container))
                )
            await asyncio.sleep(max(0.0, min(STATE_POLL_S, next_check - time.monotonic(), deadline - now)))

    async def _healthy(self, container: aiodocker.docker.DockerContainer, command: str) -> bool:
        execution = await container.exec(["sh", "-c", command], stdout=False, stderr=False, tty=False)
        await execution.start(detach=True)
        while True:
            inspected = await execution.inspect()
            if not inspected.get("Running"):
                return inspected.get("ExitCode") == 0
            await asyncio.sleep(0.02)

    async def _tail(self, container: aiodocker.docker.DockerContainer) -> list[str]:
        try:
            lines = await container.log(stdout=True, stderr=True, tail=LOG_TAIL)
        except aiodocker.DockerError:
            return []
        return "".join(lines).splitlines()

    async def signal_commands(self, tag: str, signal_name: str) -> None:
        """Send `signal_name` to the process group of every command a step (`tag`) started in the job container."""
        if self.job_container_id is None:
            return
        container = self._client().containers.container(self.job_container_id)
        try:
            execution = await container.exec(
                signal_commands_argv(tag, signal_name), stdout=False, stderr=False, tty=False, user="0"
            )
            await execution.start(detach=True)
        except (aiodocker.DockerError, OSError) as error:
            self.log(f"signalling the step's commands in the job container: {error!r}")

    async def remove(self) -> None:
        """Remove every container, then the network, this job started; what fails is left to the sweep."""
        if not self.started and self.network is None:
            await self.close()
            return
        docker = self._client()
        try:
            if os.getuid() != 0 and self.job.container is not None and self.started:
                await self._hand_back_workspace(docker, self.started[-1])
            for container_id in reversed(self.started):
                try:
                    await docker.containers.container(container_id).delete(force=True, v=True)
                except aiodocker.DockerError as error:
                    if error.status != 404:
                        self.log(f"removing container {container_id[:12]}: {error.message}")
            self.started.clear()
            if self.network is not None:
                try:
                    await (await docker.networks.get(self.network)).delete()
                except aiodocker.DockerError as error:
                    if error.status != 404:
                        self.log(f"removing network {self.network}: {error.message}")
                self.network = None
        except OSError as error:
            self.log(f"container engine at {self.engine}: {error!r}; the agent's next start sweeps the rest")
        finally:
            await self.close()

    async def _hand_back_workspace(self, docker: aiodocker.Docker, container_id: str) -> None:
        """Files the container's root wrote in the workspace become the agent's again, so it can delete them."""
        container = docker.containers.container(container_id)
        owner = f"{os.getuid()}:{os.getgid()}"
        try:
            execution = await container.exec(["chown", "-R", owner, str(self.workspace)], user="0", tty=False)
            await execution.start(detach=True)
            for _ in range(600):
                if not (await execution.inspect()).get("Running"):
                    break
                await asyncio.sleep(0.05)
        except aiodocker.DockerError as error:
            self.log(f"giving the workspace back: {error.message}")

    async def close(self) -> None:
        if self._docker is not None:
            await self._docker.close()
            self._docker = None


async def sweep(engine: str, agent_id: str, *, timeout_s: float = 10.0) -> tuple[int, int]:
    """Remove the containers and networks labelled as job resources of `agent_id`; (containers, networks)."""
    filters = {"label": [f"{RESOURCE_LABEL}=true", f"{AGENT_LABEL}={agent_id}"]}
    async with aiodocker.Docker(url=engine) as docker:
        async with asyncio.timeout(timeout_s):
            listed = await docker.containers.list(all="1", filters=json.dumps(filters))
            networks = await docker.networks.list(filters=filters)
            return await _remove(docker, listed, networks)


async def sweep_local(engine: str, host: str, *, timeout_s: float = 10.0) -> tuple[int, int]:
    """Remove what earlier `conveyor run local` runs on `host` left (their runners are gone); (containers, networks)."""
    filters = {"label": [f"{RESOURCE_LABEL}=true"]}
    async with aiodocker.Docker(url=engine) as docker:
        async with asyncio.timeout(timeout_s):
            listed = await docker.containers.list(all="1", filters=json.dumps(filters))
            networks = await docker.networks.list(filters=filters)
            labels = [dict(c._container.get("Labels") or {}) for c in listed]
            labels += [dict(n.get("Labels") or {}) for n in networks]
            dead = dead_local_agents(
                {label.get(AGENT_LABEL, "") for label in labels}, host, psutil.pid_exists
            )
            return await _remove(
                docker,
                [c for c in listed if (c._container.get("Labels") or {}).get(AGENT_LABEL) in dead],
                [n for n in networks if (n.get("Labels") or {}).get(AGENT_LABEL) in dead],
            )


async def _remove(
    docker: aiodocker.Docker, containers: list[Any], networks: list[dict[str, Any]]
) -> tuple[int, int]:
    """Remove these containers, then these networks (one already gone counts as removed by someone else)."""
    removed_containers = removed_networks = 0
    for container in containers:
        try:
            await container.delete(force=True, v=True)
            removed_containers += 1
        except aiodocker.DockerError as error:
            if error.status != 404:
                raise
    for network in networks:
        try:
            await (await docker.networks.get(network["Id"])).delete()
            removed_networks += 1
        except aiodocker.DockerError as error:
            if error.status != 404:
                raise
    return removed_containers, removed_networks
    return True
