"""The pure half of a container job's engine resources (docs/design/containers.md §3–§5): labels, names,
create bodies, messages. `containers.py` is the I/O half (aiodocker), imported only by jobs that need it.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conveyor.errors import ConveyorError
from conveyor.lockfile.models import ContainerEntry, ServiceEntry
from conveyor.model.job_resources import (
    AGENT_LABEL,
    JOB_LABEL,
    RESOURCE_LABEL,
    ROLE_LABEL,
    SERVICE_LABEL,
)

DEFAULT_ENGINE = "unix:///var/run/docker.sock"
# The agent id a runner's resources are labelled with; the agent sets it in its runners' environment.
AGENT_ID_VARIABLE = "CONVEYOR_RUNNER_AGENT_ID"
# The job container does nothing of its own: the job's commands arrive as execs.
KEEP_ALIVE = ["/bin/sh", "-c", "trap 'exit 0' TERM; while :; do sleep 3600 & wait $!; done"]
LOG_TAIL = 20
# How often a service's state is looked at while its health command is not due (a service that exits is
# reported within this).
STATE_POLL_S = 0.2
_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


class ContainerFailed(ConveyorError):
    """Starting the job's containers failed; `reason` is the job's failure reason."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True, slots=True)
class JobContainer:
    """What a step needs to run commands in the job container (sent to it in its `run` message)."""

    engine: str
    container_id: str
    image_path: str  # the image's PATH, for docs/design/containers.md §3 "Environment inside"
    user: str | None

    def as_message(self, host_path: str) -> dict[str, Any]:
        """The `container` field of a step's `run` message."""
        return {
            "engine": self.engine,
            "id": self.container_id,
            "image_path": self.image_path,
            "host_path": host_path,
            "user": self.user,
        }


def engine_address(environ: Mapping[str, str]) -> str:
    """The engine the job resources go to: `DOCKER_HOST` (Docker's or Podman's socket), else Docker's default."""
    return environ.get("DOCKER_HOST") or DEFAULT_ENGINE


def engine_may_answer(engine: str) -> bool:
    """False when the engine is a Unix socket that does not exist (a host without an engine)."""
    return not engine.startswith("unix://") or Path(engine.removeprefix("unix://")).exists()


def local_agent_id() -> str:
    """The agent id `conveyor run local` labels its resources with: this host and process."""
    return f"local-{socket.gethostname()}-{os.getpid()}"


def dead_local_agents(agent_ids: Iterable[str], host: str, alive: Callable[[int], bool]) -> set[str]:
    """Of the agent labels on job resources, those of `conveyor run local` runners of `host` that are gone.

    A local runner labels its resources `local-<host>-<its pid>` (`local_agent_id`); one whose pid is not
    alive any more was interrupted (or killed) before it removed them, so nothing of it is in use. Other
    hosts' runners, agents' ids and live pids are kept; a reused pid keeps its leftovers until it ends.
    """
    prefix = f"local-{host}-"
    dead: set[str] = set()
    for agent_id in agent_ids:
        pid = agent_id.removeprefix(prefix)
        if agent_id.startswith(prefix) and pid.isdigit() and int(pid) > 0 and not alive(int(pid)):
            dead.add(agent_id)
    return dead


def resource_labels(job_id: str, agent_id: str, role: str, service: str | None = None) -> dict[str, str]:
    """The labels on every container and network a job starts (docs/design/containers.md §5)."""
    labels = {RESOURCE_LABEL: "true", JOB_LABEL: job_id, AGENT_LABEL: agent_id, ROLE_LABEL: role}
    if service is not None:
        labels[SERVICE_LABEL] = service
    return labels


def resource_name(job_id: str, suffix: str | None = None) -> str:
    """An engine name for a job's network or container (engine names allow `[A-Za-z0-9_.-]`)."""
    base = "cvy-job-" + _NAME_UNSAFE.sub("-", job_id)
    return base if suffix is None else f"{base}-{suffix}"


def image_path(image_config: Mapping[str, Any]) -> str:
    """The `PATH` an image sets (`Config.Env`), else the usual default."""
    for item in (image_config.get("Config") or {}).get("Env") or []:
        if isinstance(item, str) and item.startswith("PATH="):
            return item.removeprefix("PATH=")
    return "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _env_list(env: Mapping[str, str]) -> list[str]:
    return [f"{name}={value}" for name, value in env.items()]


def workspace_binds(workspace: Path) -> list[str]:
    """The workspace at its own path and, when `src` is a link out of it (`conveyor run local`), its target."""
    paths = [workspace]
    src = workspace / "src"
    if src.is_symlink():
        target = src.resolve()
        if not target.is_relative_to(workspace):
            paths.append(target)
    return [f"{path}:{path}" for path in paths]


def service_config(name: str, entry: ServiceEntry, labels: Mapping[str, str], network: str) -> dict[str, Any]:
    """The create body of a service: on the job's network under its name, ports on the host's loopback."""
    exposed: dict[str, dict[str, Any]] = {}
    bindings: dict[str, list[dict[str, str]]] = {}
    for port in entry.ports:
        host, container = port.split(":")
        exposed[f"{container}/tcp"] = {}
        bindings.setdefault(f"{container}/tcp", []).append({"HostIp": "127.0.0.1", "HostPort": host})
    config: dict[str, Any] = {
        "Image": entry.image,
        "Env": _env_list(entry.env),
        "Labels": dict(labels),
        "HostConfig": {"NetworkMode": network, "PortBindings": bindings},
        "NetworkingConfig": {"EndpointsConfig": {network: {"Aliases": [name]}}},
    }
    if exposed:
        config["ExposedPorts"] = exposed
    if entry.command is not None:
        config["Cmd"] = list(entry.command)
    return config


def job_container_config(
    entry: ContainerEntry, *, binds: list[str], workdir: str, labels: Mapping[str, str], network: str
) -> dict[str, Any]:
    """The create body of the job container: waits in a shell loop, workspace at its own path."""
    options = entry.options
    host: dict[str, Any] = {"Binds": list(binds), "NetworkMode": network}
    if "memory" in options:
        host["Memory"] = int(options["memory"])
    if "cpus" in options:
        host["NanoCpus"] = int(float(options["cpus"]) * 1_000_000_000)
    if "shm_size" in options:
        host["ShmSize"] = int(options["shm_size"])
    if options.get("init"):
        host["Init"] = True
    config: dict[str, Any] = {
        "Image": entry.image,
        "Entrypoint": KEEP_ALIVE[:1],
        "Cmd": KEEP_ALIVE[1:],
        "Env": _env_list(entry.env),
        "WorkingDir": workdir,
        "Labels": dict(labels),
        "HostConfig": host,
    }
    if "user" in options:
        config["User"] = str(options["user"])
    return config


def service_failure(name: str, why: str, log_lines: Iterable[str]) -> str:
    """The job's error for a service that never became ready, with its last log lines."""
    tail = [line.rstrip("\n") for line in log_lines][-LOG_TAIL:]
    text = f"service {name!r} {why}"
    if tail:
        text += f"; its last {len(tail)} log line(s):\n" + "\n".join(tail)
    return text


def seconds(ms: int) -> str:
    return f"{ms / 1000:g}s"


def exec_pid_file(tag: str | None, unique: str) -> str:
    """Where a command's exec records its pid in the job container: tagged with its step, so stopping the
    step can find its commands (`signal_commands_argv`)."""
    return f"/tmp/.conveyor-exec-{tag or 'untagged'}-{unique}.pid"


def signal_commands_argv(tag: str, signal_name: str) -> list[str]:
    """An exec's argv sending `signal_name` to the process group of every command of step `tag` (pure)."""
    script = (
        'for f in /tmp/.conveyor-exec-"$1"-*.pid; do [ -f "$f" ] || continue; p=$(cat "$f"); '
        f'kill -{signal_name} -"$p" 2>/dev/null || kill -{signal_name} "$p" 2>/dev/null; done; exit 0'
    )
    return ["sh", "-c", script, "sh", tag]
