"""What every part of the job runner shares: its state, the values a step's run leaves, stop requests.

The parts (`logs.py`, `child.py`, `setup.py`) each add one concept's methods to `RunnerCore`;
`job.Runner` is their sum and runs the job. The methods one part calls in another are declared abstract here.
"""

from __future__ import annotations

import asyncio
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conveyor.agent.checkout import credential_values
from conveyor.agent.container_plan import JobContainer
from conveyor.agent.logs import StepLog
from conveyor.agent.mirror import Mirrors
from conveyor.agent.runner.protocol import Emitter
from conveyor.agent.spec import JobSpec
from conveyor.agent.step_spare import StepSpares
from conveyor.errors import ConveyorError
from conveyor.model.masking import Masker


class SetupFailed(ConveyorError):
    """The job cannot start its steps: `reason` is the job's reason code."""

    def __init__(self, reason: str, error: str) -> None:
        super().__init__(error)
        self.reason, self.error = reason, error


@dataclass
class ChildOutcome:
    """How a step process ended."""

    status: str
    reason: str | None = None
    error: str | None = None
    outputs: dict[str, Any] | None = None
    exit_code: int | None = None
    retry: bool = True
    began: bool = False
    result: dict[str, Any] | None = None


@dataclass
class StepRecord:
    """What later steps and hooks know about a finished step."""

    name: str
    status: str
    outputs: dict[str, Any] | None
    reason: str | None = None


@dataclass
class StopRequest:
    """Why the running child must stop: `cancel`, `force`, `step_timeout` or `job_timeout`."""

    kind: str
    grace_s: float


@dataclass
class Child:
    """A running step process: its control channel, its process groups, why it must stop."""

    process: asyncio.subprocess.Process
    writer: asyncio.StreamWriter
    groups: set[int] = field(default_factory=set)
    stop: StopRequest | None = None
    stop_event: asyncio.Event = field(default_factory=asyncio.Event)
    # A container job's step: the tag of the pid files its commands write in the job container.
    exec_tag: str | None = None


class RunnerCore(ABC):
    """Runs one job: the state its parts share."""

    def __init__(
        self,
        spec: JobSpec,
        workspace: Path,
        *,
        emit: Emitter,
        venvs_dir: Path | None = None,
        clock: Callable[[], float] = time.monotonic,
        spares: StepSpares | None = None,
        mirrors: Mirrors | None = None,
    ) -> None:
        self.spec = spec
        self.spares = spares or StepSpares(Path("/"))
        self.workspace = workspace
        self.src = workspace / "src"
        # Where the workflow file is imported from: the workspace's checkout, or a global workflow's own
        # repository beside it (docs/design/global_workflows.md §5).
        self.workflow_src = workspace / "workflow" if spec.workflow.repo is not None else self.src
        self.tmp = workspace / "tmp"
        self.emit = emit
        self.venvs_dir = venvs_dir or workspace / "venvs"
        self.mirrors = mirrors
        self.clock = clock
        self.masker = Masker(
            [*spec.secrets.values(), *credential_values(spec.repo.auth_header if spec.repo else None)]
        )
        self.logs: dict[int, StepLog] = {}
        self.held: dict[int, list[dict[str, Any]]] = {}
        self.announced: set[int] = set()
        self.groups: set[int] = set()
        self.python = sys.executable
        self.path_prefix: list[str] = []
        self.env_updates: dict[str, str] = {}
        self.records: dict[str, StepRecord] = {}
        self.child: Child | None = None
        self.cancel: StopRequest | None = None
        self.cancel_reason: str | None = None
        self.job_timed_out = False
        self.next_index = 1
        self.started = clock()
        self.pending_emits: dict[str, Child] = {}
        self.in_hooks = False
        self.containers: Any = None  # a `containers.JobContainers` (imported when a job needs one)
        self.containers_import: asyncio.Future[Any] | None = None
        self.containers_starting: asyncio.Future[None] | None = None
        self.pull_gate = asyncio.Event()
        self.setup_abandoned = False
        self._later: set[asyncio.Future[None]] = set()
        self.job_container: JobContainer | None = None

    # --- what one part calls in another

    @abstractmethod
    def log(self, index: int, text: str, stream: str = "sys") -> None:
        """One line into a step's log, masked (`logs.py`)."""

    @abstractmethod
    def _add_line(self, index: int, text: str, stream: str) -> None:
        """One line, already masked, into a step's log (`logs.py`)."""

    @abstractmethod
    async def run_child(
        self,
        index: int,
        message: dict[str, Any],
        *,
        timeout_ms: int | None,
        on_begin: Callable[[], None],
    ) -> ChildOutcome:
        """Start a step process and wait for it (`child.py`)."""
