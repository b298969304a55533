"""Worker mode (docs/design/cluster.md §1, §4): a database-less node that runs rerouted jobs on its own
agents.

The worker reuses the agent hub (`conveyor.agents.hub.AgentHub`) and the scaler manager
(`conveyor.scaler.manager.ScalerManager`) through their storage seams: `WorkerJournal` is the hub's
journal (agent tokens minted here and kept only as SHA-256 in memory; agent messages become
`job.progress`, `log.chunk` and `event.emit` relays), `WorkerRecords` is the manager's spawn records
(its pending jobs are the held jobs no agent has taken), and `WorkerDispatcher` hands held jobs to
connected agents. Secrets and clone credentials live only in `HeldJob`, are masked in every relayed
line, and are erased when the job ends; terminal progress goes through the durable outbox first.

Each adapter is one module: `service.py` (`WorkerService`), `held.py` (`HeldJob`), `journal.py`,
`dispatcher.py`, `records.py`, `tokens.py` (`MemoryAgentTokens`), `logs.py` (`LogRelayBuffer`,
`RelayedLogs`), `knobs.py` (inventory and knobs for start-up). This module re-exports what other code uses.
"""

from conveyor.cluster.worker.dispatcher import WorkerDispatcher
from conveyor.cluster.worker.held import HeldJob
from conveyor.cluster.worker.journal import WorkerJournal
from conveyor.cluster.worker.knobs import worker_inventory, worker_knob, worker_knob_default
from conveyor.cluster.worker.logs import LOG_BUFFER_BYTES, LogRelayBuffer, RelayedLogs
from conveyor.cluster.worker.records import WorkerRecords
from conveyor.cluster.worker.service import (
    EMIT_TIMEOUT_S,
    RESEND_AFTER_S,
    TAKEN_BACK_REASONS,
    TERMINAL,
    WorkerService,
)
from conveyor.cluster.worker.tokens import MemoryAgentTokens

__all__ = [
    "EMIT_TIMEOUT_S",
    "LOG_BUFFER_BYTES",
    "RESEND_AFTER_S",
    "TAKEN_BACK_REASONS",
    "TERMINAL",
    "HeldJob",
    "LogRelayBuffer",
    "MemoryAgentTokens",
    "RelayedLogs",
    "WorkerDispatcher",
    "WorkerJournal",
    "WorkerRecords",
    "WorkerService",
    "worker_inventory",
    "worker_knob",
    "worker_knob_default",
]
