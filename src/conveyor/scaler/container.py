"""The `container` scaler backend: one agent per container, through the docker or podman CLI
(docs/design/scaler.md §6.2).

The CLI is driven as an asyncio subprocess; nothing talks to a daemon socket directly, so docker and podman
(rootless included) work the same way. Every container is labelled with the node and boot that made it, so
`list_live` can report every managed container on the host and the orphans API decides ownership. Secrets
never reach argv: environment variables are passed as `-e NAME` with the value in the CLI's own environment.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar
from urllib.parse import urlsplit, urlunsplit

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

log = logging.getLogger("conveyor.scaler.container")

RUNTIMES = ("docker", "podman")
PULL_POLICIES = ("always", "if-not-present", "never")
NO_RUNTIME = "no container runtime found (docker or podman)"
MANAGED_LABEL = "conveyor.managed"
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")
HOST_GATEWAY_NAME = "host.docker.internal"
DEFAULT_STOP_GRACE_S = 10.0
CLI_TIMEOUT_S = 120.0  # a pull may be slow; anything else answers in seconds
POLL_INTERVAL_S = 2.0
LOG_TAIL_LINES = 200


@dataclass(frozen=True)
class CliResult:
    """One CLI call's outcome."""

    returncode: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def error(self) -> str:
        """The stderr (else stdout) in one line, for messages."""
        text = (self.stderr.strip() or self.stdout.strip() or f"exit code {self.returncode}").splitlines()
        return " / ".join(line.strip() for line in text if line.strip())


class CliError(Exception):
    """A CLI call failed; the message carries its stderr."""


# --- pure parts -----------------------------------------------------------------------------------------


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
    name that `--add-host host.docker.internal:host-gateway` provides. With `network: host` loopback is the host.
    """
    if network == "host":
        return url
    parts = urlsplit(url)
    if parts.hostname is None or parts.hostname not in {h.strip("[]") for h in LOOPBACK_HOSTS}:
        return url
    netloc = HOST_GATEWAY_NAME + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def run_arguments(
    request: SpawnRequest,
    *,
    node_id: str,
    boot_id: str,
    options: Mapping[str, Any],
    env_names: Iterable[str],
) -> list[str]:
    """The `run` arguments of an agent's container (after the CLI name). Env values are not on argv."""
    label_set = request.label_set.options
    args = ["run", "-d", "--name", container_name(request.agent_id)]
    for key, value in container_labels(request, node_id, boot_id).items():
        args += ["--label", f"{key}={value}"]
    limits = request.limits
    if limits is not None and limits.cpus:
        args += ["--cpus", f"{limits.cpus:g}"]
    if limits is not None and limits.mem_bytes:
        args += ["--memory", str(limits.mem_bytes)]
    for name in env_names:
        args += ["-e", name]
    if options.get("network") != "host":
        args += ["--add-host", f"{HOST_GATEWAY_NAME}:host-gateway"]
    for host in options.get("extra_hosts") or []:
        args += ["--add-host", str(host)]
    for volume in options.get("volumes") or []:
        args += ["-v", str(volume)]
    if options.get("network"):
        args += ["--network", str(options["network"])]
    args.append(str(label_set["image"]))
    args += [str(item) for item in label_set.get("command") or []]
    return args


def agent_environment(request: SpawnRequest, network: str | None) -> dict[str, str]:
    """The variables the container receives (`request.env` with the URL made reachable from inside)."""
    env = dict(request.env)
    if "CONVEYOR_AGENT_URL" in env:
        env["CONVEYOR_AGENT_URL"] = container_agent_url(env["CONVEYOR_AGENT_URL"], network)
    env.pop("CONVEYOR_AGENT_HOME", None)  # a host path means nothing inside the container
    return env


def _parse_labels(raw: Any) -> dict[str, str]:
    """Labels from `ps --format json`: docker gives "k=v,k2=v2", podman a mapping."""
    if isinstance(raw, Mapping):
        return {str(key): str(value) for key, value in raw.items()}
    if isinstance(raw, str) and raw:
        pairs = (item.partition("=") for item in raw.split(",") if item)
        return {key: value for key, _, value in pairs}
    return {}


def _parse_created(entry: Mapping[str, Any]) -> float | None:
    created = entry.get("Created")
    if isinstance(created, int | float):  # podman: epoch seconds
        return float(created)
    text = entry.get("CreatedAt")
    if isinstance(text, str):
        with contextlib.suppress(ValueError):
            return datetime.strptime(text[:25], "%Y-%m-%d %H:%M:%S %z").timestamp()
    return None


@dataclass(frozen=True)
class PsEntry:
    """One container of `ps -a --format json`."""

    container_id: str
    name: str
    state: str
    labels: dict[str, str]
    created: float | None


def parse_ps(output: str) -> list[PsEntry]:
    """`ps --format json` output: docker prints one object per line, podman one array."""
    text = output.strip()
    if not text:
        return []
    raw: list[Any]
    if text.startswith("["):
        raw = json.loads(text)
    else:
        raw = [json.loads(line) for line in text.splitlines() if line.strip()]
    entries = []
    for item in raw:
        names = item.get("Names")
        name = names[0] if isinstance(names, list) and names else str(names or "")
        entries.append(
            PsEntry(
                container_id=str(item.get("ID") or item.get("Id") or ""),
                name=name.lstrip("/"),
                state=str(item.get("State") or "").lower(),
                labels=_parse_labels(item.get("Labels")),
                created=_parse_created(item),
            )
        )
    return entries


def live_item(entry: PsEntry) -> LiveItem:
    """A listed container as a live item (`vm_id` = its agent id, else its container id)."""
    agent_id = entry.labels.get("conveyor.agent-id") or None
    return LiveItem(
        vm_id=agent_id or entry.container_id,
        kind="container",
        backend="container",
        backend_ref=entry.container_id,
        agent_id=agent_id,
        scaler=entry.labels.get("conveyor.scaler"),
        node_marker=entry.labels.get("conveyor.node"),
        boot_marker=entry.labels.get("conveyor.boot"),
        started_at=entry.created,
    )


def is_no_such_container(result: CliResult) -> bool:
    """docker and podman both say "no such container" for an unknown name or id."""
    return "no such container" in (result.stderr + result.stdout).lower()


# --- the backend ----------------------------------------------------------------------------------------


@dataclass
class _Tracked:
    agent: ManagedAgent
    on_event: OnEvent
    registered: bool = False
    ring: LogRing | None = None


class ContainerBackend(ScalerBackend):
    """Agents in docker/podman containers (one per agent; single use)."""

    type: ClassVar[str] = "container"
    scaler_keys: ClassVar[frozenset[str]] = frozenset(
        {"runtime", "extra_hosts", "volumes", "network", "stop_timeout_s"}
    )
    label_set_keys: ClassVar[frozenset[str]] = frozenset({"image", "image_pull_policy", "command"})

    def __init__(
        self, entry: ScalerEntry, context: BackendContext, *, poll_interval_s: float = POLL_INTERVAL_S
    ) -> None:
        super().__init__(entry, context)
        self.poll_interval_s = poll_interval_s
        self.runtime_name: str | None = None  # "docker" | "podman" once detected (shown in status)
        self._runtime_path: str | None = None
        self._runtime_lock = asyncio.Lock()
        self._agents: dict[str, _Tracked] = {}
        self._monitor: asyncio.Task[None] | None = None

    # -- configuration --

    @classmethod
    def validate_entry(cls, entry: ScalerEntry) -> list[str]:
        """Type-specific keys as `field: problem` (the loader prefixes file and scaler); images are required."""
        options = entry.options
        errors: list[str] = []
        runtime = options.get("runtime", "auto")
        if runtime not in ("auto", *RUNTIMES):
            errors.append(f"runtime: must be auto, docker or podman (got {runtime!r})")
        elif not any(shutil.which(name) for name in _candidates(runtime)):
            errors.append(f"runtime: {NO_RUNTIME}")
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
        if entry.options.get("runtime", "auto") != self.entry.options.get("runtime", "auto"):
            self.runtime_name = None
            self._runtime_path = None
        self.entry = entry

    @property
    def _grace_s(self) -> float:
        return float(self.entry.options.get("stop_timeout_s", DEFAULT_STOP_GRACE_S))

    # -- the CLI --

    async def detect_runtime(self) -> str:
        """The CLI to use: the first of docker, podman (or the configured one) on PATH whose `version` works."""
        async with self._runtime_lock:
            if self._runtime_path is not None:
                return self._runtime_path
            problems: list[str] = []
            for name in _candidates(self.entry.options.get("runtime", "auto")):
                path = shutil.which(name)
                if path is None:
                    continue
                result = await _run_cli(path, ["version"], timeout_s=30.0)
                if result.ok:
                    self.runtime_name, self._runtime_path = name, path
                    log.info("scaler %s: container runtime %s (%s)", self.name, name, path)
                    return path
                problems.append(f"{name} version: {result.error()}")
            raise CliError(NO_RUNTIME + (f" ({'; '.join(problems)})" if problems else ""))

    async def _cli(
        self, args: Sequence[str], *, env: Mapping[str, str] | None = None, timeout_s: float = CLI_TIMEOUT_S
    ) -> CliResult:
        return await _run_cli(await self.detect_runtime(), args, env=env, timeout_s=timeout_s)

    # -- spawn --

    async def spawn(self, request: SpawnRequest, on_event: OnEvent) -> ManagedAgent:
        """Pull per policy, then `run -d` the agent's container; returns once the container started."""
        agent = ManagedAgent(
            agent_id=request.agent_id,
            scaler=self.name,
            label_set=request.labels,
            backend_ref=container_name(request.agent_id),
        )
        tracked = _Tracked(agent, on_event)
        self._agents[request.agent_id] = tracked
        ran = False
        try:
            await self._pull_if_needed(request)
            network = self.entry.options.get("network")
            env = agent_environment(request, network)
            args = run_arguments(
                request,
                node_id=self.context.node_id,
                boot_id=self.context.boot_id,
                options=self.entry.options,
                env_names=sorted(env),
            )
            on_event(ScalerEvent(request.agent_id, "provisioning", f"starting container {agent.backend_ref}"))
            ran = True
            result = await self._cli(args, env={**os.environ, **env})
            if not result.ok:
                raise SpawnFailed(f"container run failed: {result.error()}")
            container_id = (
                result.stdout.strip().splitlines()[-1] if result.stdout.strip() else agent.backend_ref
            )
        except (SpawnFailed, CliError) as exc:
            self._agents.pop(request.agent_id, None)
            if ran:  # `run` may have created the container before failing (e.g. it could not start it)
                with contextlib.suppress(CliError):
                    await self._remove(container_name(request.agent_id), grace_s=0)
            if isinstance(exc, CliError):
                raise SpawnFailed(str(exc)) from exc
            raise
        if agent.state == "destroying" or request.agent_id not in self._agents:
            # destroy() ran while `run` was in flight and found nothing to stop: end what `run` made.
            await self._remove(container_id, grace_s=0)
            raise SpawnFailed("destroyed while the container was starting")
        agent.backend_ref = container_id
        agent.state = "running"
        self._ensure_monitor()
        return agent

    async def _pull_if_needed(self, request: SpawnRequest) -> None:
        image = str(request.label_set.options["image"])
        policy = request.label_set.options.get("image_pull_policy", "if-not-present")
        if policy == "never":
            return
        if policy == "if-not-present" and (await self._cli(["image", "inspect", image], timeout_s=60.0)).ok:
            return
        result = await self._cli(["pull", image])
        if not result.ok:
            raise SpawnFailed(f"image pull failed for {image}: {result.error()}")

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
            except Exception:  # a flaky CLI call must not end the watch; the next round retries
                log.warning("scaler %s: checking container exits failed", self.name, exc_info=True)

    async def check_exits(self) -> None:
        """One round of exit detection (also called directly by tests instead of waiting for the poll)."""
        result = await self._cli(
            [
                "ps",
                "-a",
                "--filter",
                f"label=conveyor.node={self.context.node_id}",
                "--filter",
                f"label=conveyor.scaler={self.name}",
                "--format",
                "json",
            ],
            timeout_s=60.0,
        )
        if not result.ok:
            raise CliError(f"container ps failed: {result.error()}")
        running = {
            entry.labels.get("conveyor.agent-id")
            for entry in parse_ps(result.stdout)
            if entry.state == "running"
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
        """The container's last output lines (stdout and stderr)."""
        ring = LogRing()
        logs = await self._cli(["logs", "--tail", str(LOG_TAIL_LINES), ref], timeout_s=60.0)
        for line in (logs.stdout + logs.stderr).splitlines():
            ring.add(line)
        return ring

    async def _report_exit(self, agent_id: str, tracked: _Tracked) -> None:
        ref = tracked.agent.backend_ref
        exit_code: int | None = None
        inspected = await self._cli(["inspect", ref], timeout_s=60.0)
        if inspected.ok:
            with contextlib.suppress(ValueError, LookupError, TypeError):
                exit_code = int(json.loads(inspected.stdout)[0]["State"]["ExitCode"])
        tracked.ring = ring = await self._read_logs(ref)
        if self._agents.get(agent_id) is not tracked or tracked.agent.state != "running":
            return  # destroyed meanwhile: that path reports nothing
        self._agents.pop(agent_id, None)
        await self._remove(ref, grace_s=0)
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
        """`stop -t <grace>` then `rm -f`; idempotent, and an unknown agent id is a no-op."""
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

    async def _remove(self, ref: str, *, grace_s: float) -> None:
        """Stop then remove a container; "no such container" counts as done."""
        if grace_s > 0:
            stopped = await self._cli(["stop", "-t", str(round(grace_s)), ref], timeout_s=grace_s + 60.0)
            if not stopped.ok and not is_no_such_container(stopped):
                log.warning("scaler %s: stop %s failed: %s", self.name, ref, stopped.error())
        removed = await self._cli(["rm", "-f", ref], timeout_s=60.0)
        if not removed.ok and not is_no_such_container(removed):
            raise CliError(f"container rm failed for {ref}: {removed.error()}")

    async def list_live(self) -> list[LiveItem]:
        """Every managed container on this host (any node, any boot; exited ones too, they still hold a name)."""
        result = await self._cli(
            ["ps", "-a", "--filter", f"label={MANAGED_LABEL}=true", "--format", "json"], timeout_s=60.0
        )
        if not result.ok:
            raise CliError(f"container ps failed: {result.error()}")
        return [live_item(entry) for entry in parse_ps(result.stdout)]

    async def stop_live(self, item: LiveItem) -> None:
        """End one listed container (orphan stop, restart clean-up)."""
        if item.agent_id is not None and item.agent_id in self._agents:
            await self.destroy(item.agent_id, reason="stopped through the orphans API")
            return
        await self._remove(item.backend_ref, grace_s=self._grace_s)

    async def shutdown_all(self) -> None:
        await super().shutdown_all()
        if self._monitor is not None:
            self._monitor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._monitor


def _candidates(runtime: str) -> tuple[str, ...]:
    return RUNTIMES if runtime == "auto" else (runtime,)


async def _run_cli(
    program: str, args: Sequence[str], *, env: Mapping[str, str] | None = None, timeout_s: float
) -> CliResult:
    """Run the CLI; a timeout kills it and reads as a failure."""
    try:
        process = await asyncio.create_subprocess_exec(
            program,
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=dict(env) if env is not None else None,
        )
    except OSError as exc:
        return CliResult(127, "", f"cannot run {program}: {exc}")
    try:
        stdout, stderr = await asyncio.wait_for(process.communicate(), timeout_s)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()
        return CliResult(-1, "", f"{program} {' '.join(args[:2])} timed out after {timeout_s:g} s")
    return CliResult(
        process.returncode or 0, stdout.decode(errors="replace"), stderr.decode(errors="replace")
    )
