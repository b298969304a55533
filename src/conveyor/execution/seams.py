"""Parts of higher packages that execution's routes call, as seams execution defines (docs/design/ARCHITECTURE.md
§3, "Seams upward"): the ingest hook publishes its status reporter and the agents hook its hub's sweep under
these keys; execution knows them only by these Protocols."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from conveyor.parts import PartKey


class Wakeable(Protocol):
    """A loop that does its next pass now when woken."""

    def wake(self) -> None:
        """Run the next pass now."""


STATUS_REPORTER = PartKey[Wakeable]("status_reporter")
"""The commit-status reporter (`conveyor.ingest.reporter.StatusReporter`): woken when a run changes."""

AGENT_SWEEP = PartKey[Callable[[], Awaitable[None]]]("agent_sweep")
"""This node's agent hub's sweep (`AgentHub.sweep_once`): tells its agents of cancels at once."""
