"""What a running server holds (its long-running parts are `conveyor.runtime.node.Component`s)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from conveyor.admin.audit import ReadLogWriter
from conveyor.db.engine import Database
from conveyor.parts import Parts
from conveyor.runtime.node import Component
from conveyor.server.config import Settings
from conveyor.server.metrics import Metrics
from conveyor.server.startup import StartupState


@dataclass
class ServerState:
    """Everything a running server holds; `app.state` points at its parts. Start-up hooks see it as a
    `conveyor.runtime.node.Node`."""

    settings: Settings
    db: Database
    metrics: Metrics
    startup: StartupState = field(default_factory=StartupState)
    started_monotonic: float = field(default_factory=time.monotonic)
    instance_id: str | None = None
    components: list[Component] = field(default_factory=list)
    # Called once the database is prepared; each returns the components it started.
    on_database_ready: list[Callable[[ServerState], Awaitable[Sequence[Component]]]] = field(
        default_factory=list
    )
    # What start-up hooks published for routes and later hooks, by typed key (`conveyor.parts`).
    parts: Parts = field(default_factory=Parts)
    read_log: ReadLogWriter | None = None
    ready_cache: tuple[float, int, dict[str, Any]] | None = None
    fatal_exit: Callable[[str], None] | None = None
    # This process holds the `$CONVEYOR_HOME` lock (server/home_lock.py): with the home's own SQLite file,
    # a live-looking instance row of this home belongs to a crashed predecessor.
    home_locked: bool = False


StartupHook = Callable[[ServerState], Awaitable[Sequence[Component]]]
