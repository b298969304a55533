"""The scaler manager: spawns one-shot agents for queued jobs and cleans up after them
(docs/design/scaler.md §3).

One `ScalerManager` per orchestrator. Its loop (woken with the dispatcher, polled every second)
looks at pending queue rows that no connected agent can take now, picks a label set
(docs/design/scaler.md §5), checks capacity and provision backoff, mints a single-use ephemeral token bound to
a fresh agent id, writes the spawn record and starts the compute. The agent hub tells it when a spawned agent
registers (`agent_registered`; `bound_job` is the one job the dispatcher may send that agent) and when it
disconnects (`agent_disconnected`, which tears the compute down: single use). The same loop enforces
registration deadlines, idle limits and warm pools.

The manager is put together from parts, as `cluster/reroute/` is: `core.py` (a spawn, a scaler's runtime, the
shared state), `loop.py` (start, stop, each round: deadlines, idle agents, warm pools), `pending.py` (which
jobs get a spawn, and their notes), `spawning.py` (a spawn from reservation to teardown), `backoff.py`
(provision backoff, pure), `host.py` (dead-item sweeps, leftovers of an older boot), `reload.py` and
`status.py` (pure); `service.py` is `ScalerManager`. This module re-exports what the rest of the code uses.
"""

from conveyor.scaler.manager.backoff import backoff_delay_ms, failure_message
from conveyor.scaler.manager.core import AgentView, ManagerSettings, ScalerRuntime, Spawn
from conveyor.scaler.manager.pending import Outcome
from conveyor.scaler.manager.reload import ReloadInProgress
from conveyor.scaler.manager.service import ScalerManager

__all__ = [
    "AgentView",
    "ManagerSettings",
    "Outcome",
    "ReloadInProgress",
    "ScalerManager",
    "ScalerRuntime",
    "Spawn",
    "backoff_delay_ms",
    "failure_message",
]
