"""Event-system metrics (docs/design/events.md §8), registered in the server's per-process registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class EventMetrics:
    """The collectors of the event store, router, cron and registration sync."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = registry or CollectorRegistry()
        self.emitted = Counter(
            "conveyor_events_emitted_total", "Events stored", ["event", "origin"], registry=r
        )
        self.rejected = Counter(
            "conveyor_events_rejected_total", "Emits refused", ["event", "reason"], registry=r
        )
        self.processed = Counter(
            "conveyor_events_processed_total", "Events processed", ["event", "outcome"], registry=r
        )
        self.unmatched = Counter(
            "conveyor_events_unmatched_total",
            "Reserved events that matched nothing",
            ["event", "reason"],
            registry=r,
        )
        self.retries = Counter(
            "conveyor_events_retries_total", "Failed attempts to retry", ["event"], registry=r
        )
        self.dlq = Counter(
            "conveyor_events_dlq_total", "Events moved to the DLQ", ["event", "reason"], registry=r
        )
        self.lease_expirations = Counter(
            "conveyor_events_lease_expirations_total", "Expired event leases released", registry=r
        )
        self.lease_lost = Counter(
            "conveyor_events_lease_lost_total", "Finishes that lost their lease", registry=r
        )
        self.catchup_failures = Counter(
            "conveyor_events_catchup_failures_total", "Failed catch-up drains", registry=r
        )
        self.listen_reconnects = Counter(
            "conveyor_events_listen_reconnects_total", "LISTEN connection re-opens", registry=r
        )
        self.attempts = Histogram(
            "conveyor_events_attempts",
            "Attempts an event took",
            ["event", "result"],
            buckets=(1, 2, 3, 4, 5, 10, 20, 50),
            registry=r,
        )
        self.processing_seconds = Histogram(
            "conveyor_events_processing_seconds", "Lease to finish", ["event"], registry=r
        )
        self.backlog = Gauge("conveyor_events_backlog", "Unfinished events", registry=r)
        self.dlq_depth = Gauge("conveyor_events_dlq_depth", "Events in the DLQ", registry=r)
        self.windows_open = Gauge(
            "conveyor_event_batch_windows_open", "Open failure-batch windows", registry=r
        )
        self.batches_emitted = Counter(
            "conveyor_event_batches_emitted_total", "Failure batches emitted", registry=r
        )
        self.cron_fires = Counter("conveyor_cron_fires_total", "Cron fire attempts", ["result"], registry=r)
        self.cron_skipped = Counter(
            "conveyor_cron_slots_skipped_total", "Missed cron slots skipped", registry=r
        )
        self.registration_syncs = Counter(
            "conveyor_registration_syncs_total", "Registration syncs", ["mode", "result"], registry=r
        )
