"""The scaler manager's shared state (docs/design/scaler.md §3): a spawn and a configured scaler as this node
holds them, the manager's settings, and `ManagerCore`, which its parts extend (`loop`, `pending`, `spawning`,
`host`, `reload`; put together in `service.ScalerManager`).
"""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from conveyor.db.engine import Database
from conveyor.execution.queue import AgentSlot
from conveyor.scaler import store
from conveyor.scaler.backend import BackendContext, LabelSetSpec, ScalerBackend, ScalerEntry, ScalerEvent
from conveyor.scaler.config import ScalerConfig
from conveyor.scaler.manager.reattempts import FailedTeardown
from conveyor.scaler.metrics import ScalerMetrics
from conveyor.scaler.records import DatabaseSpawnRecords, SpawnRecords

LOOP_POLL_S = 1.0
WARM_FILL_S = 5.0
UNCLAIMED_IDLE_S = 60.0


class AgentView(Protocol):
    """A connected agent as the hub holds it."""

    agent_id: str
    labels: tuple[str, ...]
    mandatory_labels: tuple[str, ...]
    jobs: set[str]

    def free_slot(self) -> AgentSlot | None: ...

    def bound_job_id(self) -> str | None: ...


@dataclass
class Spawn:
    """One spawned agent, from reservation to teardown (this node's memory)."""

    agent_id: str
    scaler: str
    label_set: LabelSetSpec
    bound_job_id: str | None
    run_id: str | None
    org_id: str | None
    warm: bool
    cpus: float
    mem_bytes: int
    spawned_mono: float
    deadline_mono: float
    timeout_ms: int
    token_id: str | None = None
    registered: bool = False
    took_job: bool = False
    idle_since: float = 0.0
    ended: bool = False
    events: list[ScalerEvent] = field(default_factory=list)


@dataclass
class ScalerRuntime:
    """A configured scaler on this node: its backend and its provision-backoff state."""

    entry: ScalerEntry
    backend: ScalerBackend
    semaphore: asyncio.Semaphore
    retiring: bool = False
    failures: int = 0
    next_attempt_at: float = 0.0  # wall clock
    last_error: str | None = None
    failing: bool = False
    backoff_ms: int = 0  # the window set by the last failure
    capacity_waiters: int = 0
    last_warm_fill: float = 0.0


@dataclass
class Reattempt:
    """A failed teardown waiting for its next attempt: its schedule, what it ends, and how to try again."""

    state: FailedTeardown
    what: str
    retry: Callable[[], Awaitable[None]]


@dataclass(frozen=True)
class ManagerSettings:
    """What the manager reads from the node (cluster/org settings are read live through `knob`)."""

    orchestrator_url: str
    unclaimed_idle_s: float = UNCLAIMED_IDLE_S
    loop_poll_s: float = LOOP_POLL_S
    warm_fill_s: float = WARM_FILL_S


class ManagerCore(ABC):
    """This node's scaler manager: the state its parts share, and what each part asks of another."""

    def __init__(
        self,
        *,
        db: Database | None = None,
        records: SpawnRecords | None = None,
        context: BackendContext,
        config: ScalerConfig,
        registry: Mapping[str, type[ScalerBackend]],
        settings: ManagerSettings,
        knob: Callable[[str, str | None], Awaitable[int]],
        load_config: Callable[[], ScalerConfig],
        connected: Callable[[], Mapping[str, AgentView]] = dict,
        draining: Callable[[], bool] = lambda: False,
        metrics: ScalerMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.db = db
        if records is None:
            assert db is not None, "a scaler manager without spawn records keeps them in the database"
            records = DatabaseSpawnRecords(db)
        self.records = records
        self.context = context
        self.config = config
        self.registry = registry
        self.settings = settings
        self.knob = knob
        self.load_config = load_config
        self.connected = connected
        self.draining = draining
        self.metrics = metrics or ScalerMetrics()
        # The schedule of teardown reattempts (monotonic seconds); injected so tests step it.
        self.clock = clock
        self.failed_teardowns: dict[str, Reattempt] = {}
        self.scalers: dict[str, ScalerRuntime] = {}
        self.spawns: dict[str, Spawn] = {}
        self.notes: dict[str, str] = {}
        # The refusal each waiting job was last counted for: a job refused round after round for the
        # same reason counts once (the metric counts refusals, not polls).
        self._refused: dict[str, tuple[str, str]] = {}
        self._written_notes: dict[str, str] = {}
        self._lock = asyncio.Lock()
        self._reload_lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[Any]] = set()
        # Teardowns under way (a subset of `_background`): stopping waits for them, never cancels them.
        self._teardowns: set[asyncio.Task[Any]] = set()
        self.reloads = {"applied": 0, "failed": 0}
        self._last_sweep = 0.0
        self._last_reap = time.monotonic()
        for entry in config.entries:
            self.scalers[entry.name] = self._runtime(entry)

    def _runtime(self, entry: ScalerEntry) -> ScalerRuntime:
        backend = self.registry[entry.type](entry, self.context)
        return ScalerRuntime(
            entry=entry, backend=backend, semaphore=asyncio.Semaphore(entry.max_concurrent_spawns)
        )

    def wake(self) -> None:
        """Something changed (rows enqueued, capacity freed, backoff over, reload): run a round soon."""
        self._wake.set()

    def _spawn_task(self, coroutine: Awaitable[Any], name: str, *, teardown: bool = False) -> None:
        task = asyncio.ensure_future(coroutine)
        task.set_name(name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        if teardown:
            self._teardowns.add(task)
            task.add_done_callback(self._teardowns.discard)

    @abstractmethod
    async def drive_pending(self) -> None:
        """Request a spawn for each pending row no free connected agent can take (`pending.py`)."""

    @abstractmethod
    async def _reserve(
        self, runtime: ScalerRuntime, label_set: LabelSetSpec, *, job: store.PendingJob | None, warm: bool
    ) -> Spawn | str | None:
        """The spawn; a capacity refusal; or None when another spawn already serves the job (`spawning.py`)."""

    @abstractmethod
    async def _spawn_failed(self, spawn: Spawn, detail: str, log_tail: list[str], *, outcome: str) -> None:
        """A provisioning failure: tear down, count it for backoff, show it on the job (`spawning.py`)."""

    @abstractmethod
    async def _end(self, spawn: Spawn, *, reason: str) -> None:
        """Tear down an agent whose life ended normally (`spawning.py`)."""

    @abstractmethod
    def teardown_failed(self, key: str, what: str, retry: Callable[[], Awaitable[None]], error: str) -> None:
        """A teardown raised: try it again every `scaler_reap_reattempt_interval_ms` (`host.py`)."""

    @abstractmethod
    async def reattempt_teardowns(self) -> None:
        """Start the failed teardowns that are due again (`host.py`)."""

    @abstractmethod
    async def sweep_backends(self) -> None:
        """Backends with a dead-item sweep run it (`host.py`)."""

    @abstractmethod
    async def end_leftovers(self) -> list[str]:
        """At boot: end live items of an older boot of this node (`host.py`)."""
