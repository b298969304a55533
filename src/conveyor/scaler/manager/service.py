"""The scaler manager (docs/design/scaler.md §3): its parts put together."""

from __future__ import annotations

import time
from typing import Any

from conveyor.scaler.manager.host import HostPart
from conveyor.scaler.manager.loop import LoopPart
from conveyor.scaler.manager.pending import PendingPart
from conveyor.scaler.manager.reload import ReloadPart
from conveyor.scaler.manager.spawning import SpawnPart
from conveyor.scaler.manager.status import scaler_status


class ScalerManager(LoopPart, PendingPart, SpawnPart, HostPart, ReloadPart):
    """This node's scaler manager.

    State is `core.ManagerCore`'s; the loop, pending jobs, spawns, the host's leftovers and reloads are each
    one part (`loop.py`, `pending.py`, `spawning.py`, `host.py`, `reload.py`).
    """

    def status(self) -> list[dict[str, Any]]:
        """Per scaler: capacity, active, warm, backoff state and last error (`status.scaler_status`)."""
        return scaler_status(self.scalers, self.spawns, self.connected(), time.time())
