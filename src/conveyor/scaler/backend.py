"""The scaler backend interface and its value types (docs/design/scaler.md §2).

Every backend (`bare-metal`, `container`, `firecracker`) implements `ScalerBackend`. The manager
owns capacity, tokens, spawn records, deadlines and backoff; a backend only starts and ends compute
on this host and reports what it sees through `on_event`.

Contract, in short:

- `spawn(request, on_event)` starts the compute for `request.agent_id` and returns a `ManagedAgent`
  once the compute has *started* (not registered). It adds the agent to the backend's own map at
  once, so `destroy`/`shutdown_all` can reach it even while `spawn` is still running. Raising from
  `spawn` is a failed spawn (`SpawnFailed(detail, log_tail)` carries a message for the job's reason);
  the backend must have undone whatever it started before raising.
- When the compute ends *before* `mark_registered(agent_id)` the backend emits
  `ScalerEvent(kind="failed", detail=..., exit_code=..., log_tail=...)` — a provisioning failure the
  manager counts for backoff. When it ends *after* `mark_registered`, the backend emits
  `ScalerEvent(kind="exited")` — a normal disconnect, never counted.
- `destroy(agent_id, reason=..., grace_s=...)` is idempotent; an unknown id is a no-op. It returns
  once the compute is gone (SIGTERM/stop, wait up to the grace, then SIGKILL/kill).
- `list_live()` returns everything live *on this host* that this backend type manages, including
  items of other nodes/boots (stamped with `node_marker`/`boot_marker`), for orphan handling and the
  restart clean-up; `stop_live(item)` ends one such item.
- `validate_entry(entry)` (class method) checks the type-specific keys of a `scalers.yaml` entry and
  returns error strings (no I/O beyond cheap checks such as "is there a runtime on PATH"); the config
  loader calls it at boot and on reload, and `validate_reload(entry)` on the running instance.

The request carries everything a backend needs; it never reads the database. `BackendContext`
(given at construction) holds the node identity, the home directory and a live reader of cluster
settings (`firecracker_api_socket_wait_ms`, ...).

The pure cmd.exe argument rules live in `conveyor.scaler.windows_cmd`
(`cmd_safety_refusal(token, use, remedy) -> str | None`).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from conveyor.errors import ConveyorError

__all__ = [
    "BackendContext",
    "EventKind",
    "LabelSetSpec",
    "Limits",
    "LiveItem",
    "LogRing",
    "ManagedAgent",
    "OnEvent",
    "Resources",
    "ScalerBackend",
    "ScalerEntry",
    "ScalerEvent",
    "SpawnContext",
    "SpawnFailed",
    "SpawnRequest",
]

EventKind = Literal["provisioning", "network", "ready", "failed", "connecting", "exited"]
AgentState = Literal["spawning", "running", "destroying"]
LiveKind = Literal["process", "container", "vm"]

LOG_TAIL_LINES = 200
LOG_TAIL_BYTES = 64 * 1024


@dataclass(frozen=True)
class Limits:
    """Resource limits handed to the compute (`None` = unlimited)."""

    cpus: float | None = None
    mem_bytes: int | None = None


@dataclass(frozen=True)
class Resources:
    """Requests (counted against caps) and limits (enforced where the backend can)."""

    request_cpus: float = 0.0
    request_mem_bytes: int = 0
    limits: Limits = field(default_factory=Limits)


@dataclass(frozen=True)
class LabelSetSpec:
    """One configured label set of a scaler.

    `labels` are the normalised user labels (no `conveyor:` label); `auto_labels` the automatic
    `conveyor:os:*`/`conveyor:arch:*` labels the manager adds for matching. `options` holds the
    type-specific keys as written in `scalers.yaml` (`image`, `image_pull_policy`, `rootfs_path`,
    `vcpu_count`, `mem_size_mib`, ...).
    """

    labels: tuple[str, ...]
    auto_labels: tuple[str, ...] = ()
    resources: Resources | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)

    @property
    def all_labels(self) -> tuple[str, ...]:
        """User labels plus automatic labels, sorted (what the agent registers and is matched on)."""
        return tuple(sorted({*self.labels, *self.auto_labels}))


@dataclass(frozen=True)
class ScalerEntry:
    """One scaler of `scalers.yaml` after validation.

    `options` holds the type-specific scaler keys as written (`command`, `enforce_cgroups`,
    `runtime`, `extra_hosts`, `volumes`, `network`, `firecracker_path`, `kernel_path`,
    `chroot_base_dir`, `require_sudo`, `terminate_grace_s`, ...).
    """

    name: str
    type: str
    max_agents: int
    label_sets: tuple[LabelSetSpec, ...]
    mandatory_labels: tuple[str, ...] = ()
    max_concurrent_spawns: int = 8
    orchestrator_url: str | None = None
    warm_pool_size: int = 0
    warm_idle_timeout_s: float = 300.0
    resource_cap: Resources | None = None
    source: str = ""  # the file it came from, for messages
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SpawnContext:
    """What the spawn is for."""

    bound_job_id: str | None = None
    run_id: str | None = None
    org_id: str | None = None
    warm: bool = False


@dataclass(frozen=True)
class SpawnRequest:
    """Everything a backend needs to start one agent.

    `env` is the final extra environment for the agent (orchestrator's `CONVEYOR_AGENT_ENV_*`, then
    the label set's `env`, then the fixed `CONVEYOR_AGENT_URL`, `CONVEYOR_AGENT_TOKEN`,
    `CONVEYOR_AGENT_ID`, `CONVEYOR_AGENT_LABELS`, `CONVEYOR_AGENT_EPHEMERAL=1` — the manager builds
    it; backends pass it through without putting the token on argv). `deadline` is a
    `time.monotonic()` value by which the agent must have registered (backends may use it to bound
    their own waits).
    """

    agent_id: str
    scaler: str
    label_set: LabelSetSpec
    orchestrator_url: str
    token: str
    env: Mapping[str, str]
    limits: Limits | None
    context: SpawnContext
    deadline: float

    @property
    def labels(self) -> tuple[str, ...]:
        """The full label set the agent registers with."""
        return self.label_set.all_labels


@dataclass
class ManagedAgent:
    """A spawned agent as the backend tracks it. `backend_ref`: pid, container id or VM id."""

    agent_id: str
    scaler: str
    label_set: tuple[str, ...]
    backend_ref: str
    spawned_at: float = field(default_factory=time.time)
    state: AgentState = "spawning"
    pid: int | None = None


@dataclass(frozen=True)
class LiveItem:
    """Something live on this host that a backend manages (orphan listing, restart clean-up).

    `vm_id` is the VM id, or the agent id of a process/container (a container's id when it carries
    no agent-id label). `node_marker`/`boot_marker` are the instance id and boot id stamped on the
    item at spawn (container labels, VM `meta.json`, bare-metal record file).
    """

    vm_id: str
    kind: LiveKind
    backend: str
    backend_ref: str
    agent_id: str | None = None
    scaler: str | None = None
    node_marker: str | None = None
    boot_marker: str | None = None
    pid: int | None = None
    started_at: float | None = None


@dataclass(frozen=True)
class ScalerEvent:
    """Progress of one spawn: buffered by the manager, written to the run timeline once linked."""

    agent_id: str
    kind: EventKind
    detail: str = ""
    at: float = field(default_factory=time.time)
    exit_code: int | None = None
    log_tail: tuple[str, ...] = ()


class SpawnFailed(ConveyorError):
    """`spawn` could not start the compute; `detail` is shown on the queued job and in status."""

    def __init__(self, detail: str, log_tail: list[str] | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.log_tail = list(log_tail or [])


@dataclass(frozen=True)
class BackendContext:
    """The node a backend runs on.

    `home` is `$CONVEYOR_HOME`; backends keep their files under `home / "scaler"`.
    `cluster_setting(name)` reads a cluster setting live (e.g. `firecracker_api_socket_wait_ms`).
    `database` is the coordinator's `conveyor.db.engine.Database` (None on a worker); typed `Any`
    so this module stays free of the db package. `event_settings()` answers the event system's current
    `EventSettings` (what the `event` backend's emits are checked against; None on a worker).
    """

    home: Path
    node_id: str
    boot_id: str
    cluster_setting: Callable[[str], Awaitable[int]]
    database: Any = None
    event_settings: Callable[[], Any] | None = None


OnEvent = Callable[[ScalerEvent], None]


class ScalerBackend(ABC):
    """One configured scaler's compute backend (one instance per `scalers.yaml` entry)."""

    type: ClassVar[str]
    # Type-specific keys allowed at scaler level and label-set level (beyond the common ones).
    scaler_keys: ClassVar[frozenset[str]] = frozenset()
    label_set_keys: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, entry: ScalerEntry, context: BackendContext) -> None:
        self.entry = entry
        self.context = context

    @property
    def name(self) -> str:
        return self.entry.name

    @classmethod
    def validate_entry(cls, entry: ScalerEntry) -> list[str]:
        """Errors in the type-specific keys of `entry` (empty = acceptable)."""
        return []

    @abstractmethod
    async def spawn(self, request: SpawnRequest, on_event: OnEvent) -> ManagedAgent:
        """Start the compute; return once it started. Raise `SpawnFailed` (after undoing) on failure."""

    @abstractmethod
    async def destroy(self, agent_id: str, *, reason: str, grace_s: float | None = None) -> None:
        """End the agent's compute (idempotent; an unknown id is a no-op)."""

    @abstractmethod
    def mark_registered(self, agent_id: str) -> None:
        """The agent registered: a later exit is a disconnect (`exited`), not a failed spawn."""

    @abstractmethod
    def is_alive(self, agent_id: str) -> bool:
        """Whether this backend still runs compute for `agent_id`."""

    @abstractmethod
    async def list_live(self) -> list[LiveItem]:
        """Everything live on this host that this backend type manages (any node, any boot)."""

    @abstractmethod
    async def stop_live(self, item: LiveItem) -> None:
        """End one listed item (orphan stop, restart clean-up)."""

    async def shutdown_all(self) -> None:
        """Destroy every agent this instance manages."""
        for agent_id in list(self.managed()):
            await self.destroy(agent_id, reason="shutdown")

    @abstractmethod
    def managed(self) -> dict[str, ManagedAgent]:
        """The agents this instance currently manages, by agent id."""

    def active_count(self) -> int:
        """Live agents of this instance."""
        return len(self.managed())

    def validate_reload(self, entry: ScalerEntry) -> list[str]:
        """Errors that forbid replacing this instance's entry by `entry` (empty = acceptable)."""
        return type(self).validate_entry(entry)

    def apply_reload(self, entry: ScalerEntry) -> None:
        """Take the new entry (must not fail once validated). Running agents are untouched."""
        self.entry = entry

    def log_tail(self, agent_id: str) -> list[str]:
        """The agent's last output lines (at most 200 lines / 64 KiB); empty when unknown."""
        return []


class LogRing:
    """The last lines of a spawned agent's output (200 lines / 64 KiB), for `failed` events."""

    def __init__(self, max_lines: int = LOG_TAIL_LINES, max_bytes: int = LOG_TAIL_BYTES) -> None:
        self.max_lines = max_lines
        self.max_bytes = max_bytes
        self._lines: list[str] = []
        self._bytes = 0

    def add(self, line: str) -> None:
        line = line.rstrip("\r\n")
        self._lines.append(line)
        self._bytes += len(line.encode("utf-8", "replace")) + 1
        while self._lines and (len(self._lines) > self.max_lines or self._bytes > self.max_bytes):
            dropped = self._lines.pop(0)
            self._bytes -= len(dropped.encode("utf-8", "replace")) + 1

    def lines(self) -> list[str]:
        return list(self._lines)
