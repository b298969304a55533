"""The events start-up hook: the router service, its leader tasks, and the producers it plugs in."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from conveyor.events.emit import add_metric_sink, remove_metric_sink
from conveyor.events.metrics import EventMetrics
from conveyor.events.models import EventSettings
from conveyor.events.producers import EventProducers
from conveyor.events.service import EventService
from conveyor.model.knobs import CLUSTER_KNOBS

if TYPE_CHECKING:
    from conveyor.server.state import Component, ServerState

SERVICE_KEY = "events"
LIVE_KNOBS = (
    "event_router_max_dispatch_attempts",
    "event_router_event_ttl_seconds",
    "event_router_rate_limit_per_workflow_per_minute",
    "event_max_payload_bytes",
)


class _Running:
    """Start/stop of the service plus the process-wide hooks it installed."""

    def __init__(self, service: EventService, producers: EventProducers, sink: Any) -> None:
        self.service = service
        self.producers = producers
        self.sink = sink

    async def start(self) -> None:
        await self.service.start()

    async def stop(self) -> None:
        self.producers.uninstall()
        remove_metric_sink(self.sink)
        await self.service.stop()


async def start(state: ServerState) -> Sequence[Component]:
    """Publish `state.services["events"]` (the `EventService`) and register cron, scan and cleanup."""
    from conveyor.runtime.boot import runtime_services
    from conveyor.runtime.lease import LeaderContext, LeaderTask

    if state.settings.cluster_role != "coordinator":
        return []
    runtime = runtime_services(state.services)
    knobs = {
        knob.name: state.settings.knob_default(knob)
        for knob in CLUSTER_KNOBS
        if knob.name.startswith("event")
    }
    settings = replace(
        EventSettings.from_env(),
        max_attempts=int(knobs.get("event_router_max_dispatch_attempts") or 5),
        ttl_seconds=int(knobs.get("event_router_event_ttl_seconds") or 604_800),
        rate_limit_per_minute=int(knobs.get("event_router_rate_limit_per_workflow_per_minute") or 100),
        max_payload_bytes=int(knobs.get("event_max_payload_bytes") or 65_536),
    )
    metrics = EventMetrics(state.metrics.registry)

    async def runs_created(_: list[str]) -> None:
        dispatcher = state.services.get("dispatcher")
        if dispatcher is not None:
            dispatcher.wake()
        reporter = state.services.get("status_reporter")
        if reporter is not None:
            reporter.wake()

    service = EventService(
        state.db,
        settings,
        owner=lambda: runtime.identity.instance_id,
        metrics=metrics,
        on_runs_created=runs_created,
    )

    async def refresh_settings() -> None:
        current = service.settings
        values = {name: await runtime.settings.cluster_value(name) for name in LIVE_KNOBS}
        service.settings = replace(
            current,
            max_attempts=int(values["event_router_max_dispatch_attempts"] or current.max_attempts),
            ttl_seconds=int(values["event_router_event_ttl_seconds"] or current.ttl_seconds),
            rate_limit_per_minute=int(
                values["event_router_rate_limit_per_workflow_per_minute"] or current.rate_limit_per_minute
            ),
            max_payload_bytes=int(values["event_max_payload_bytes"] or current.max_payload_bytes),
        )

    service.settings_refresher = refresh_settings

    def sink(event: str, label: str, rejected: bool) -> None:
        if rejected:
            metrics.rejected.labels(event, label).inc()
        else:
            metrics.emitted.labels(event, label).inc()

    add_metric_sink(sink)
    producers = EventProducers(state.db, settings, metrics, service)
    producers.install(state.services)
    state.services[SERVICE_KEY] = service
    state.services["event_producers"] = producers

    async def scan(context: LeaderContext) -> None:
        await service.scan(context.fence)

    async def cleanup(context: LeaderContext) -> None:
        await service.cleanup(context.fence)

    async def cron_tick(context: LeaderContext) -> None:
        await service.cron_tick(context.fence)

    runtime.leadership.register(LeaderTask("event-scan", int(settings.scan_seconds * 1000), scan))
    runtime.leadership.register(LeaderTask("event-cleanup", int(settings.cleanup_seconds * 1000), cleanup))
    runtime.leadership.register(LeaderTask("cron", int(settings.cron_tick_seconds * 1000), cron_tick))
    running = _Running(service, producers, sink)
    await running.start()
    return [running]
