"""The coordinator's reroute service (docs/design/cluster.md §4.2, §4.5): its parts put together."""

from __future__ import annotations

from typing import Any

from conveyor.cluster.messages import (
    EventEmitRelay,
    JobProgress,
    JobRerouteAck,
    LogChunkRelay,
    PeerError,
    ScalerEventRelay,
)
from conveyor.cluster.reroute.offers import OfferPart
from conveyor.cluster.reroute.reports import ReportPart
from conveyor.cluster.reroute.windows import WindowPart


class RerouteService(OfferPart, WindowPart, ReportPart):
    """Coordinator side of rerouting: worker capacity in the dispatcher, offers, acks, progress.

    State, capacity and sends are `core.RerouteCore`'s; offers, spawn windows and workers' reports are
    each one part (`offers.py`, `windows.py`, `reports.py`).
    """

    async def handle(self, sender: str, message: Any) -> bool:
        """Route one job-path message from a worker session; False when it is not one."""
        if isinstance(message, JobRerouteAck):
            await self.on_ack(sender, message)
        elif isinstance(message, JobProgress):
            await self.on_progress(sender, message)
        elif isinstance(message, LogChunkRelay):
            await self.on_log_chunk(sender, message)
        elif isinstance(message, EventEmitRelay):
            await self.on_event_emit(sender, message)
        elif isinstance(message, ScalerEventRelay):
            await self.on_scaler_event(sender, message)
        elif isinstance(message, PeerError) and message.message_id in self.pending:
            # The worker could not read the offer: a NAK `invalid`.
            offer = self.pending[message.message_id]
            await self.on_ack(
                sender,
                JobRerouteAck(
                    message_id=message.message_id, job_id=offer.job_id, accepted=False, reason="invalid"
                ),
            )
        else:
            return False
        return True
