"""The shared scaler configuration on a node (docs/design/scaler.md §11): holding the stored version, and
reloading the scaler when a new one arrives.

Where a version comes from is the node's business: a coordinator reads the `scaler_config` row when the
cluster settings' version moves (`database_source`), a worker takes it from its applied settings snapshot.
`SharedConfigWatcher` holds what it last got (the scaler's loader reads it) and, when the version changes and
this node runs no local file, reloads the scaler like `scaler reload`: all or nothing. A version this node
refuses is not tried again until the next one; a reload already under way is retried at the next round.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from conveyor.db.engine import Database
from conveyor.parts import PartKey
from conveyor.runtime.loops import WakeableLoop
from conveyor.scaler import store
from conveyor.scaler.config import ScalerConfigError, SharedConfig
from conveyor.scaler.manager import ReloadInProgress, ScalerManager

log = logging.getLogger(__name__)

# What a node asks for the stored configuration, given the one it holds (None: none is stored).
Source = Callable[[SharedConfig | None], Awaitable[SharedConfig | None]]


def _key(config: SharedConfig | None) -> tuple[int, str] | None:
    return (config.version, config.sha256) if config is not None else None


def database_source(db: Database, settings_version: Callable[[], Awaitable[int]]) -> Source:
    """A coordinator's source: the row, read again only when `settings_version` (the cluster settings'
    version through this node's settings cache) moved. A set bumps that version in the configuration's own
    transaction, so a round with no change costs no query of its own."""
    read_at: int | None = None

    async def read(held: SharedConfig | None) -> SharedConfig | None:
        nonlocal read_at
        version = await settings_version()
        if version == read_at:
            return held
        async with db.read() as conn:
            row = await store.read_shared_config(conn)
        read_at = version
        return row.shared() if row is not None else None

    return read


class SharedConfigWatcher:
    """Holds this node's copy of the shared configuration and applies new versions to its scaler."""

    def __init__(self, source: Source, *, uses_local: Callable[[], bool], poll_s: float) -> None:
        self.source = source
        self.uses_local = uses_local
        self.current: SharedConfig | None = None
        self.manager: ScalerManager | None = None
        # The problems of the last version this node refused (None once one applied).
        self.error: str | None = None
        self._retry = False
        self._loop = WakeableLoop("scaler-shared-config", self.round, poll_s, log)

    async def refresh(self) -> None:
        """Take the stored version without applying it (at boot, before the scaler's first load)."""
        self.current = await self.source(self.current)

    def wake(self) -> None:
        """Look for a new version now (after a set on this node, or a pulled snapshot on a worker)."""
        self._loop.wake()

    async def round(self) -> None:
        """One look: a new version is held and, unless this node runs local files, reloaded."""
        config = await self.source(self.current)
        if _key(config) == _key(self.current) and not self._retry:
            return
        self.current = config
        self._retry = False
        if self.manager is None:
            return
        if self.uses_local():
            log.info(
                "shared scaler configuration version %d is stored; this node runs its local scalers.yaml",
                config.version if config else 0,
            )
            return
        try:
            result = await self.manager.reload()
        except ReloadInProgress:
            self._retry = True
            return
        except ScalerConfigError as exc:
            self.error = "; ".join(exc.problems)
            log.error(
                "shared scaler configuration version %d refused on this node, the running configuration "
                "was kept: %s",
                config.version if config else 0,
                self.error,
            )
            return
        self.error = None
        log.info(
            "shared scaler configuration version %d applied: %s",
            config.version if config else 0,
            ", ".join(result["scalers"]) or "no scalers",
        )

    def status(self) -> dict[str, Any]:
        """The `config` part of `GET scaler/status` (the running configuration's origin is the manager's)."""
        running = self.manager.config if self.manager is not None else None
        return {
            "origin": running.origin if running else "none",
            "sources": list(running.sources) if running else [],
            "shared_version": running.shared_version if running else None,
            "stored_shared_version": self.current.version if self.current else 0,
            "shared_error": self.error,
        }

    async def start(self) -> None:
        """Begin watching."""
        await self._loop.start()

    async def stop(self) -> None:
        """Stop watching."""
        await self._loop.stop()


SHARED_CONFIG = PartKey[SharedConfigWatcher]("scaler_shared_config")
"""This node's watcher of the shared scaler configuration (coordinators and workers)."""
