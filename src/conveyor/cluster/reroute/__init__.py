"""Job rerouting, coordinator side (docs/design/cluster.md §4): which worker, what its answer means, flap
grace.

The decisions are pure functions over plain values (a worker's last heartbeat inventory, the offer's
fields) in `policy.py`; `RerouteService` (`service.py`) around them loads, decides and stores, in parts:
`core.py` (shared state, worker capacity in the dispatcher, cancels), `offers.py` (offers, acks, hops),
`windows.py` (spawn windows, Layer A, and re-dispatch), `reports.py` (what workers report). `settings.py`
holds the per-job knobs. This module re-exports what the rest of the code uses.
"""

from conveyor.cluster.reroute.core import (
    TEST_WITHHOLD_ACKS_ENV,
    PeerSender,
    PendingOffer,
    RerouteMetrics,
    WorkerLink,
)
from conveyor.cluster.reroute.offers import HISTORY_REASON_MAX
from conveyor.cluster.reroute.policy import (
    NAK_BACKOFF_BASE_MS,
    NAK_BACKOFF_CAP_MS,
    CapacityUnit,
    NakBackoff,
    RerouteAnswer,
    SpawnFailureVerdict,
    WorkerCapacity,
    WorkerView,
    capacity_units,
    choose_worker,
    nak_backoff_ms,
    on_relayed_spawn_failure,
    reroute_answer,
    spoken_for,
    within_flap_grace,
    worker_agent_id,
    worker_can_serve,
    worker_capacity,
    worker_rank,
    worker_wait_note,
)
from conveyor.cluster.reroute.service import RerouteService
from conveyor.cluster.reroute.settings import RerouteSettings, resolve_reroute_settings
from conveyor.cluster.reroute.windows import WINDOW_RETRY_S

__all__ = [
    "HISTORY_REASON_MAX",
    "NAK_BACKOFF_BASE_MS",
    "NAK_BACKOFF_CAP_MS",
    "TEST_WITHHOLD_ACKS_ENV",
    "WINDOW_RETRY_S",
    "CapacityUnit",
    "NakBackoff",
    "PeerSender",
    "PendingOffer",
    "RerouteAnswer",
    "RerouteMetrics",
    "RerouteService",
    "RerouteSettings",
    "SpawnFailureVerdict",
    "WorkerCapacity",
    "WorkerLink",
    "WorkerView",
    "capacity_units",
    "choose_worker",
    "nak_backoff_ms",
    "on_relayed_spawn_failure",
    "reroute_answer",
    "resolve_reroute_settings",
    "spoken_for",
    "within_flap_grace",
    "worker_agent_id",
    "worker_can_serve",
    "worker_capacity",
    "worker_rank",
    "worker_wait_note",
]
