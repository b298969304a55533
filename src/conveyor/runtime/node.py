"""What a start-up hook sees of the running node, and what it may do to it (docs/design/ARCHITECTURE.md §3).

`server` calls every package's start-up hook with its `ServerState`; the hooks sit below `server` and so
may not import it. Each hook instead declares what it reads as a Protocol built on `Node` (its package's
settings on top of `NodeSettings`), and mypy checks at `server/wiring.py` that `ServerState` is one. The
few things a hook may do to the node itself live here too: refuse to boot (`FatalStartupError`) and
name the node in every later log line (`set_instance_id`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

from conveyor.errors import ConveyorError
from conveyor.parts import Parts

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from conveyor.db.engine import Database
    from conveyor.model.knobs import Knob

Role = Literal["coordinator", "worker"]


class FatalStartupError(ConveyorError):
    """The node must not run (the message says what to do); the process exits non-zero."""


class Component(Protocol):
    """A long-running part of the server, started once the database is ready."""

    async def start(self) -> None:
        """Begin background work."""

    async def stop(self) -> None:
        """End background work (called in reverse start order)."""


class NodeSettings(Protocol):
    """What every start-up hook may read of the node's configuration (`server.config.Settings`)."""

    home: Path
    cluster_role: Role
    instance_id: str | None
    sweep_interval_ms: int

    def knob_default(self, knob: Knob) -> int | None:
        """The configured default of a knob: env/YAML when given, else the built-in default."""


class NodeMetrics(Protocol):
    """The node's Prometheus registry, which a package's own collectors join."""

    registry: CollectorRegistry


class BootProgress(Protocol):
    """How a hook that must wait long before the node is ready says so (`server.startup.StartupState`)."""

    waiting: str | None

    def listen_while(self, waiting: str) -> None:
        """Open the listener now and report `waiting` in `/ready` until the hook clears it."""


class Node(Protocol):
    """The running node as a start-up hook sees it (`server.state.ServerState`)."""

    db: Database
    # What start-up hooks published for routes and later hooks, by typed key (`conveyor.parts`).
    parts: Parts
    instance_id: str | None

    @property
    def settings(self) -> NodeSettings: ...

    @property
    def metrics(self) -> NodeMetrics: ...


# The instance id every log line of this process carries once the node knows it (`server/logs.py`).
_log_instance_id: list[str | None] = [None]


def set_instance_id(instance_id: str | None) -> None:
    """Stamp every later log line with this node's instance id."""
    _log_instance_id[0] = instance_id


def logged_instance_id() -> str | None:
    """The instance id log lines carry (None until the node has one)."""
    return _log_instance_id[0]
