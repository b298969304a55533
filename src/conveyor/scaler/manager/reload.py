"""Reloading the scaler configuration (docs/design/scaler.md §3): every file re-read and validated, then
applied whole or not at all; scalers gone from it retire once their agents have ended.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from typing import Any

from conveyor.errors import ConveyorError
from conveyor.scaler.config import ScalerConfig, ScalerConfigError
from conveyor.scaler.manager.backoff import clear_backoff
from conveyor.scaler.manager.core import ManagerCore

log = logging.getLogger(__name__)


class ReloadInProgress(ConveyorError):
    """Another reload is running."""


class ReloadPart(ManagerCore):
    """The configuration reload."""

    def reload_problems(self, config: ScalerConfig) -> list[str]:
        """What stops `config` from replacing the running one, beyond its own validation: a scaler whose
        type changed, and each running backend's `validate_reload` of its new entry."""
        problems: list[str] = []
        for entry in config.entries:
            current = self.scalers.get(entry.name)
            if current is None:
                continue
            if current.entry.type != entry.type:
                problems.append(
                    f"{entry.source}: scalers[{entry.name}].type: changing a scaler's type "
                    f"({current.entry.type} → {entry.type}) is not reloadable; remove it and add it "
                    "under a new name"
                )
                continue
            problems.extend(
                f"{entry.source}: scalers[{entry.name}].{p}" for p in current.backend.validate_reload(entry)
            )
        return problems

    async def reload(self) -> dict[str, Any]:
        """Re-read and validate every file; apply all of it or nothing. Raises `ScalerConfigError`."""
        if self._reload_lock.locked():
            raise ReloadInProgress("a scaler reload is already in progress")
        async with self._reload_lock:
            try:
                config = await asyncio.to_thread(self.load_config)
                problems = self.reload_problems(config)
                if problems:
                    raise ScalerConfigError(problems)
            except ScalerConfigError:
                self.reloads["failed"] += 1
                self.metrics.config_reloads.labels("failed").inc()
                raise
            async with self._lock:
                names = {entry.name for entry in config.entries}
                for entry in config.entries:
                    current = self.scalers.get(entry.name)
                    if current is None:
                        self.scalers[entry.name] = self._runtime(entry)
                        continue
                    # The shared configuration names its version in `source`: not a change by itself.
                    changed = replace(current.entry, source=entry.source) != entry
                    current.backend.apply_reload(entry)
                    current.entry = entry
                    current.retiring = False
                    if changed:  # the operator changed it: give it a fresh start
                        clear_backoff(current)
                        current.semaphore = asyncio.Semaphore(entry.max_concurrent_spawns)
                for name, runtime in self.scalers.items():
                    if name not in names:
                        runtime.retiring = True
                # Keep config order: reorder the map to the file's order, retiring ones last.
                ordered = {e.name: self.scalers[e.name] for e in config.entries}
                ordered.update({n: r for n, r in self.scalers.items() if n not in ordered})
                self.scalers = ordered
                self.config = config
                self.notes.clear()
            self.reloads["applied"] += 1
            self.metrics.config_reloads.labels("applied").inc()
            log.info("scaler configuration reloaded (%d scalers)", len(config.entries))
            self.wake()
            return {"applied": True, "scalers": [e.name for e in config.entries]}
