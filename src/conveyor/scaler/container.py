"""The `container` scaler backend: one agent per container, through the Docker Engine API
(docs/design/scaler.md §6.2, which names the CLIs; `docs/decisions.md` says why the API instead).

aiodocker speaks the Engine API to Docker's socket or to Podman's Docker-compatible one, so both work the
same way, rootless Podman included. Every container is labelled with the node and boot that made it, so
`list_live` can report every managed container on the host and the orphans API decides ownership. The
agent's token travels in the create request's environment over the engine's socket, never on a command line.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlsplit, urlunsplit

import aiodocker

from conveyor.errors import ConveyorError
from conveyor.model.job_resources import agent_resource_filter
from conveyor.scaler.backend import (
    BackendContext,
    LiveItem,
    LogRing,
    ManagedAgent,
    OnEvent,
    ScalerBackend,
    ScalerEntry,
    ScalerEvent,
    SpawnFailed,
    SpawnRequest,
)

log = logging.getLogger(__name__)

RUNTIMES = ("docker", "podman")
PULL_POLICIES = ("always", "if-not-present", "never")
ENGINE_SCHEMES = ("unix", "tcp", "http", "https")
NO_RUNTIME = "no container engine found (a Docker or Podman API socket)"
MANAGED_LABEL = "conveyor.managed"
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")
HOST_GATEWAY_NAME = "host.docker.internal"
DEFAULT_STOP_GRACE_S = 10.0
ENGINE_TIMEOUT_S = 60.0  # any call but a pull answers in seconds
PULL_TIMEOUT_S = 600.0
PROBE_TIMEOUT_S = 5.0
POLL_INTERVAL_S = 2.0
LOG_TAIL_LINES = 200


class EngineError(ConveyorError):
    """An Engine API call failed: `what` was called, `detail` is the engine's (or the socket's) answer."""

    def __init__(self, what: str, detail: str, *, status: int | None = None) -> None:
        super().__init__(f"{what}: {detail}")
        self.what = what
        self.detail = detail
        self.status = status  # the HTTP status the engine answered, if it answered

    @property
    def missing(self) -> bool:
        """The engine answered 404 (no such container or image)."""
        return self.status == 404


# --- pure parts -----------------------------------------------------------------------------------------


def engine_candidates(
    runtime: str, explicit: str | None, environ: Mapping[str, str], home: Path
) -> list[str]:
    """The engine addresses to try, in order (pure): `engine`, else the runtime's variable and sockets."""
    if explicit:
        return [explicit]
    found: list[str] = []
    if runtime in ("auto", "docker"):
        if environ.get("DOCKER_HOST"):
            found.append(environ["DOCKER_HOST"])
        found += [
            "unix:///var/run/docker.sock",
            "unix:///run/docker.sock",
            f"unix://{home}/.docker/run/docker.sock",
        ]
    if runtime in ("auto", "podman"):
        if environ.get("CONTAINER_HOST"):
            found.append(environ["CONTAINER_HOST"])
        runtime_dir = environ.get("XDG_RUNTIME_DIR")
        if runtime_dir:
            found.append(f"unix://{runtime_dir}/podman/podman.sock")
        found.append("unix:///run/podman/podman.sock")
    return list(dict.fromkeys(found))


def engine_may_answer(address: str) -> bool:
    """A cheap look before any call: a unix socket address needs its socket file (no I/O for TCP)."""
    parts = urlsplit(address)
    return parts.scheme != "unix" or Path(parts.path).is_socket()


def runtime_of(version: Mapping[str, Any]) -> str:
    """`docker` or `podman`, from the engine's `GET /version` answer (pure)."""
    names = [str(component.get("Name", "")) for component in version.get("Components") or []]
    return "podman" if any("podman" in name.lower() for name in names) else "docker"


def container_name(agent_id: str) -> str:
    """The container's name for an agent."""
    return f"cvy-{agent_id}"


def container_labels(request: SpawnRequest, node_id: str, boot_id: str) -> dict[str, str]:
    """The labels stamped on an agent's container (node/boot markers for orphans and restart clean-up)."""
    labels = {
        MANAGED_LABEL: "true",
        "conveyor.node": node_id,
        "conveyor.boot": boot_id,
        "conveyor.scaler": request.scaler,
        "conveyor.agent-id": request.agent_id,
    }
    if request.context.bound_job_id:
        labels["conveyor.job-id"] = request.context.bound_job_id
    if request.context.run_id:
        labels["conveyor.run-id"] = request.context.run_id
    return labels


def container_agent_url(url: str, network: str | None) -> str:
    """The orchestrator URL as seen from inside a container.

    A loopback address inside a container is the container itself, so it is rewritten to the host gateway
    name that the `host.docker.internal:host-gateway` extra host provides. With `network: host` loopback is
    the host.
    """
    if network == "host":
        return url
    parts = urlsplit(url)
    if parts.hostname is None or parts.hostname not in {h.strip("[]") for h in LOOPBACK_HOSTS}:
        return url
    netloc = HOST_GATEWAY_NAME + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def agent_environment(request: SpawnRequest, network: str | None) -> dict[str, str]:
    """The variables the container receives (`request.env` with the URL made reachable from inside)."""
    env = dict(request.env)
    if "CONVEYOR_AGENT_URL" in env:
        env["CONVEYOR_AGENT_URL"] = container_agent_url(env["CONVEYOR_AGENT_URL"], network)
    env.pop("CONVEYOR_AGENT_HOME", None)  # a host path means nothing inside the container
    return env


def container_config(
    request: SpawnRequest,
    *,
    node_id: str,
    boot_id: str,
    options: Mapping[str, Any],
    env: Mapping[str, str],
) -> dict[str, Any]:
    """The `POST /containers/create` body of an agent's container (pure)."""
    label_set = request.label_set.options
    network = options.get("network")
    host_config: dict[str, Any] = {}
    limits = request.limits
    if limits is not None and limits.cpus:
        host_config["NanoCpus"] = round(limits.cpus * 1_000_000_000)
    if limits is not None and limits.mem_bytes:
        host_config["Memory"] = int(limits.mem_bytes)
    extra_hosts = [] if network == "host" else [f"{HOST_GATEWAY_NAME}:host-gateway"]
    extra_hosts += [str(host) for host in options.get("extra_hosts") or []]
    if extra_hosts:
        host_config["ExtraHosts"] = extra_hosts
    if options.get("volumes"):
        host_config["Binds"] = [str(volume) for volume in options["volumes"]]
    if network:
        host_config["NetworkMode"] = str(network)
    config: dict[str, Any] = {
        "Image": str(label_set["image"]),
        "Env": [f"{name}={value}" for name, value in sorted(env.items())],
        "Labels": container_labels(request, node_id, boot_id),
        "HostConfig": host_config,
    }
    if label_set.get("command"):
        config["Cmd"] = [str(item) for item in label_set["command"]]
    return config


def live_item(entry: Mapping[str, Any]) -> LiveItem:
    """A `GET /containers/json` entry as a live item (`vm_id` = its agent id, else its container id)."""
    labels = entry.get("Labels") or {}
    agent_id = labels.get("conveyor.agent-id") or None
    container_id = str(entry.get("Id") or "")
    created = entry.get("Created")
    return LiveItem(
        vm_id=agent_id or container_id,
        kind="container",
        backend="container",
        backend_ref=container_id,
        agent_id=agent_id,
        scaler=labels.get("conveyor.scaler"),
        node_marker=labels.get("conveyor.node"),
        boot_marker=labels.get("conveyor.boot"),
        started_at=float(created) if isinstance(created, int | float) else None,
    )


def label_filters(labels: Iterable[str]) -> str:
    """The `filters` query value selecting containers that carry every `key=value` of `labels` (pure)."""
    return json.dumps({"label": list(labels)})


def listed_entry(container: Any) -> dict[str, Any]:
    """The fields of one `GET /containers/json` entry that the backend reads (from aiodocker's object)."""
    return {key: container[key] for key in ("Id", "Labels", "State", "Created") if key in container}


def one_line(message: str) -> str:
    """An engine's (possibly multi-line) error message in one line, for reasons and logs."""
    return " / ".join(line.strip() for line in message.splitlines() if line.strip()) or "no detail"


# --- the backend ----------------------------------------------------------------------------------------


@dataclass
class _Tracked:
    agent: ManagedAgent
    on_event: OnEvent
    registered: bool = False
    ring: LogRing | None = None


class ContainerBackend(ScalerBackend):
    """Agents in containers of a Docker or Podman engine (one per agent; single use)."""

    type: ClassVar[str] = "container"
    scaler_keys: ClassVar[frozenset[str]] = frozenset(
        {"runtime", "engine", "extra_hosts", "volumes", "network", "stop_timeout_s"}
    )
    label_set_keys: ClassVar[frozenset[str]] = frozenset({"image", "image_pull_policy", "command"})

    def __init__(
        self, entry: ScalerEntry, context: BackendContext, *, poll_interval_s: float = POLL_INTERVAL_S
    ) -> None:
        super().__init__(entry, context)
        self.poll_interval_s = poll_interval_s
        self.runtime_name: str | None = None  # "docker" | "podman" once an engine answered (shown in status)
        self.engine_address: str | None = None
        self._docker: aiodocker.Docker | None = None
        self._engine_lock = asyncio.Lock()
        self._agents: dict[str, _Tracked] = {}
        self._monitor: asyncio.Task[None] | None = None

    # -- configuration --

    @classmethod
    def validate_entry(cls, entry: ScalerEntry) -> list[str]:
        """Type-specific keys as `field: problem` (the loader prefixes file and scaler); images are required."""
        options = entry.options
        errors: list[str] = []
        runtime = options.get("runtime", "auto")
        engine = options.get("engine")
        if runtime not in ("auto", *RUNTIMES):
            errors.append(f"runtime: must be auto, docker or podman (got {runtime!r})")
        elif engine is not None:
            if not isinstance(engine, str) or urlsplit(engine).scheme not in ENGINE_SCHEMES:
                errors.append(f"engine: must be a unix://, tcp:// or http(s):// address (got {engine!r})")
        elif not any(
            engine_may_answer(address)
            for address in engine_candidates(runtime, None, os.environ, Path.home())
        ):
            errors.append(f"runtime: {NO_RUNTIME}; set engine: unix:///path/to/docker.sock")
        for key in ("extra_hosts", "volumes"):
            value = options.get(key, [])
            if not isinstance(value, list) or not all(isinstance(item, str) and item for item in value):
                errors.append(f"{key}: must be a list of strings")
        for host in options.get("extra_hosts") or []:
            if isinstance(host, str) and ":" not in host:
                errors.append(f"extra_hosts: {host!r} must read NAME:IP")
        network = options.get("network")
        if network is not None and (not isinstance(network, str) or not network):
            errors.append("network: must be a network name")
        grace = options.get("stop_timeout_s", DEFAULT_STOP_GRACE_S)
        if not isinstance(grace, int | float) or isinstance(grace, bool) or grace < 0:
            errors.append("stop_timeout_s: must be a number of seconds ≥ 0")
        for index, label_set in enumerate(entry.label_sets):
            at = f"label_sets[{index}]"
            image = label_set.options.get("image")
            if not isinstance(image, str) or not image.strip():
                errors.append(f"{at}.image: required for a container scaler")
            policy = label_set.options.get("image_pull_policy", "if-not-present")
            if policy not in PULL_POLICIES:
                errors.append(
                    f"{at}.image_pull_policy: must be always, if-not-present or never (got {policy!r})"
                )
            command = label_set.options.get("command")
            if command is not None and (
                not isinstance(command, list) or not all(isinstance(item, str) for item in command)
            ):
                errors.append(f"{at}.command: must be a list of strings")
        return errors

    def apply_reload(self, entry: ScalerEntry) -> None:
        old = (self.entry.options.get("runtime", "auto"), self.entry.options.get("engine"))
        if (entry.options.get("runtime", "auto"), entry.options.get("engine")) != old:
            # The next call looks for the engine again; the old client is closed when it is replaced.
            self.runtime_name = None
            self.engine_address = None
        self.entry = entry

    @property
    def _grace_s(self) -> float:
        return float(self.entry.options.get("stop_timeout_s", DEFAULT_STOP_GRACE_S))

    # -- the engine --

    async def engine(self) -> aiodocker.Docker:
        """The client of the engine to use: `engine`, else the first candidate socket whose `/version` answers."""
        async with self._engine_lock:
            if self._docker is not None and self.engine_address is not None:
                return self._docker
            if self._docker is not None:
                await self._docker.close()
                self._docker = None
            options = self.entry.options
            problems: list[str] = []
            for address in engine_candidates(
                options.get("runtime", "auto"), options.get("engine"), os.environ, Path.home()
            ):
                if not engine_may_answer(address):
                    continue
                client = aiodocker.Docker(url=address)
                try:
                    version = await asyncio.wait_for(client.version(), PROBE_TIMEOUT_S)
                except (aiodocker.DockerError, OSError, TimeoutError) as exc:
                    await client.close()
                    problems.append(f"{address}: {one_line(str(exc)) if str(exc) else type(exc).__name__}")
                    continue
                self._docker, self.engine_address = client, address
                self.runtime_name = runtime_of(version)
                log.info(
                    "scaler %s: container engine %s %s at %s",
                    self.name,
                    self.runtime_name,
                    version.get("Version"),
                    address,
                )
                return client
            raise EngineError("engine", NO_RUNTIME + (f" ({'; '.join(problems)})" if problems else ""))

    async def _call(self, what: str, call: Any, timeout_s: float = ENGINE_TIMEOUT_S) -> Any:
        """Await one engine call with a deadline; a failure is an `EngineError` naming `what`."""
        try:
            return await asyncio.wait_for(call, timeout_s)
        except aiodocker.DockerError as exc:
            raise EngineError(what, one_line(exc.message), status=exc.status) from exc
        except (OSError, TimeoutError) as exc:
            raise EngineError(what, one_line(str(exc)) if str(exc) else type(exc).__name__) from exc

    # -- spawn --

    async def spawn(self, request: SpawnRequest, on_event: OnEvent) -> ManagedAgent:
        """Pull per policy, then create and start the agent's container; returns once it started."""
        agent = ManagedAgent(
            agent_id=request.agent_id,
            scaler=self.name,
            label_set=request.labels,
            backend_ref=container_name(request.agent_id),
        )
        tracked = _Tracked(agent, on_event)
        self._agents[request.agent_id] = tracked
        created: str | None = None
        try:
            docker = await self.engine()
            await self._pull_if_needed(docker, request)
            network = self.entry.options.get("network")
            config = container_config(
                request,
                node_id=self.context.node_id,
                boot_id=self.context.boot_id,
                options=self.entry.options,
                env=agent_environment(request, network),
            )
            on_event(ScalerEvent(request.agent_id, "provisioning", f"starting container {agent.backend_ref}"))
            try:
                container = await self._call(
                    "container create", docker.containers.create(config, name=agent.backend_ref)
                )
                created = container.id
                await self._call("container start", container.start())
            except EngineError as exc:
                raise SpawnFailed(f"container run failed: {exc.detail}") from exc
        except (SpawnFailed, EngineError) as exc:
            self._agents.pop(request.agent_id, None)
            if created is not None:  # created but could not start: nothing may stay behind
                with contextlib.suppress(EngineError):
                    await self._remove(created, grace_s=0)
            if isinstance(exc, EngineError):
                raise SpawnFailed(exc.detail if exc.what == "engine" else str(exc)) from exc
            raise
        assert created is not None
        if agent.state == "destroying" or request.agent_id not in self._agents:
            # destroy() ran while the container was being made and found nothing to stop: end it here.
            await self._remove(created, grace_s=0)
            raise SpawnFailed("destroyed while the container was starting")
        agent.backend_ref = created
        agent.state = "running"
        self._ensure_monitor()
        return agent

    async def _pull_if_needed(self, docker: aiodocker.Docker, request: SpawnRequest) -> None:
        image = str(request.label_set.options["image"])
        policy = request.label_set.options.get("image_pull_policy", "if-not-present")
        if policy == "never":
            return
        if policy == "if-not-present":
            try:
                await self._call("image inspect", docker.images.inspect(image))
                return
            except EngineError as exc:
                if not exc.missing:
                    raise
        try:
            await self._call("image pull", docker.images.pull(image), timeout_s=PULL_TIMEOUT_S)
        except EngineError as exc:
            raise SpawnFailed(f"image pull failed for {image}: {exc.detail}") from exc

    # -- registration, exits --

    def mark_registered(self, agent_id: str) -> None:
        tracked = self._agents.get(agent_id)
        if tracked is not None:
            tracked.registered = True

    def is_alive(self, agent_id: str) -> bool:
        tracked = self._agents.get(agent_id)
        return tracked is not None and tracked.agent.state != "destroying"

    def managed(self) -> dict[str, ManagedAgent]:
        return {agent_id: tracked.agent for agent_id, tracked in self._agents.items()}

    def log_tail(self, agent_id: str) -> list[str]:
        tracked = self._agents.get(agent_id)
        return tracked.ring.lines() if tracked is not None and tracked.ring is not None else []

    def _ensure_monitor(self) -> None:
        if self._monitor is None or self._monitor.done():
            self._monitor = asyncio.get_running_loop().create_task(
                self._watch_exits(), name=f"scaler-{self.name}-container-exits"
            )

    async def _watch_exits(self) -> None:
        """Poll this node's containers of this scaler while any agent runs; report and remove the exited."""
        while any(t.agent.state == "running" for t in self._agents.values()):
            await asyncio.sleep(self.poll_interval_s)
            try:
                await self.check_exits()
            except Exception:  # a flaky engine call must not end the watch; the next round retries
                log.warning("scaler %s: checking container exits failed", self.name, exc_info=True)

    async def check_exits(self) -> None:
        """One round of exit detection (also called directly by tests instead of waiting for the poll)."""
        docker = await self.engine()
        filters = label_filters([f"conveyor.node={self.context.node_id}", f"conveyor.scaler={self.name}"])
        listed = await self._call("container list", docker.containers.list(all="1", filters=filters))
        entries = [listed_entry(container) for container in listed]
        running = {
            (entry.get("Labels") or {}).get("conveyor.agent-id")
            for entry in entries
            if str(entry.get("State", "")).lower() == "running"
        }
        for agent_id, tracked in list(self._agents.items()):
            if tracked.agent.state != "running":
                continue
            if agent_id not in running:
                await self._report_exit(agent_id, tracked)
            elif not tracked.registered:
                # Kept fresh until registration: a spawn that never registers fails with this tail.
                tracked.ring = await self._read_logs(tracked.agent.backend_ref)

    async def _read_logs(self, ref: str) -> LogRing:
        """The container's last output lines (stdout and stderr); empty when it cannot be read."""
        ring = LogRing()
        docker = await self.engine()
        try:
            chunks = await self._call(
                "container logs",
                docker.containers.container(ref).log(stdout=True, stderr=True, tail=LOG_TAIL_LINES),
            )
        except EngineError as exc:
            log.warning("scaler %s: %s", self.name, exc)
            return ring
        for line in "".join(chunks).splitlines():
            ring.add(line)
        return ring

    async def _report_exit(self, agent_id: str, tracked: _Tracked) -> None:
        ref = tracked.agent.backend_ref
        exit_code: int | None = None
        docker = await self.engine()
        with contextlib.suppress(EngineError, LookupError, TypeError, ValueError):
            shown = await self._call("container inspect", docker.containers.container(ref).show())
            exit_code = int(shown["State"]["ExitCode"])
        tracked.ring = ring = await self._read_logs(ref)
        if self._agents.get(agent_id) is not tracked or tracked.agent.state != "running":
            return  # destroyed meanwhile: that path reports nothing
        self._agents.pop(agent_id, None)
        await self._remove(ref, grace_s=0)
        await self.remove_job_resources(agent_id)
        if tracked.registered:
            event = ScalerEvent(
                agent_id, "exited", f"container exited with code {exit_code}", exit_code=exit_code
            )
        else:
            event = ScalerEvent(
                agent_id,
                "failed",
                f"container exited with code {exit_code} before the agent registered",
                exit_code=exit_code,
                log_tail=tuple(ring.lines()),
            )
        tracked.on_event(event)

    # -- teardown --

    async def destroy(self, agent_id: str, *, reason: str, grace_s: float | None = None) -> None:
        """Stop with the grace, then remove; idempotent, and an unknown agent id is a no-op."""
        tracked = self._agents.get(agent_id)
        if tracked is None or tracked.agent.state == "destroying":
            return
        tracked.agent.state = "destroying"
        log.info("scaler %s: destroying container of agent %s (%s)", self.name, agent_id, reason)
        try:
            await self._remove(
                tracked.agent.backend_ref, grace_s=self._grace_s if grace_s is None else grace_s
            )
        finally:
            if self._agents.get(agent_id) is tracked:
                del self._agents[agent_id]
        await self.remove_job_resources(agent_id)

    async def remove_job_resources(self, agent_id: str) -> None:
        """Remove the job containers and networks `agent_id`'s jobs left on this engine.

        docs/design/containers.md §5. Called once the agent's own container is gone (destroyed, exited, stopped as an orphan or a leftover
        of an older boot): nothing of it is in use any more, and an agent that never starts again on this
        host would otherwise leave them for good. A failure is logged; the next end of that agent retries.
        """
        docker = await self.engine()
        labels = agent_resource_filter(agent_id)
        try:
            listed = await self._call(
                "job container list", docker.containers.list(all="1", filters=label_filters(labels))
            )
            for container in listed:
                try:
                    await self._call("job container remove", container.delete(force=True, v=True))
                except EngineError as exc:
                    if not exc.missing:
                        raise
            networks = await self._call("job network list", docker.networks.list(filters={"label": labels}))
            for network in networks:
                try:
                    await self._call(
                        "job network remove", aiodocker.networks.DockerNetwork(docker, network["Id"]).delete()
                    )
                except EngineError as exc:
                    if not exc.missing:
                        raise
        except EngineError as exc:
            log.warning("scaler %s: removing the job resources of agent %s: %s", self.name, agent_id, exc)
            return
        if listed or networks:
            log.warning(
                "scaler %s: removed %d job container(s) and %d network(s) agent %s left",
                self.name,
                len(listed),
                len(networks),
                agent_id,
                extra={"agent_id": agent_id},
            )

    async def _remove(self, ref: str, *, grace_s: float) -> None:
        """Stop (SIGTERM, then SIGKILL after the grace) and remove a container; a missing one counts as done."""
        docker = await self.engine()
        container = docker.containers.container(ref)
        if grace_s > 0:
            try:
                await self._call("container stop", container.stop(t=round(grace_s)), timeout_s=grace_s + 60)
            except EngineError as exc:
                if not exc.missing:
                    log.warning("scaler %s: %s", self.name, exc)
        try:
            await self._call("container remove", container.delete(force=True, v=True))
        except EngineError as exc:
            if not exc.missing:
                raise

    async def list_live(self) -> list[LiveItem]:
        """Every managed container on this host (any node, any boot; exited ones too, they still hold a name)."""
        docker = await self.engine()
        listed = await self._call(
            "container list",
            docker.containers.list(all="1", filters=label_filters([f"{MANAGED_LABEL}=true"])),
        )
        return [live_item(listed_entry(container)) for container in listed]

    async def stop_live(self, item: LiveItem) -> None:
        """End one listed container (orphan stop, restart clean-up)."""
        if item.agent_id is not None and item.agent_id in self._agents:
            await self.destroy(item.agent_id, reason="stopped through the orphans API")
            return
        await self._remove(item.backend_ref, grace_s=self._grace_s)
        if item.agent_id is not None:
            await self.remove_job_resources(item.agent_id)

    async def shutdown_all(self) -> None:
        await super().shutdown_all()
        if self._monitor is not None:
            self._monitor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._monitor
        if self._docker is not None:
            await self._docker.close()
            self._docker = None
