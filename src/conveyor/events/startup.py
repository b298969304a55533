"""The events start-up hook: the router service, its leader tasks, and the producers it plugs in."""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol

from conveyor.events.emit import add_metric_sink, remove_metric_sink
from conveyor.events.global_eval import (
    CACHE_MAX,
    CANDIDATE_TIMEOUT,
    ROUND_TIMEOUT,
    WAIT_TIMEOUT,
    GlobalEvaluator,
    GlobalKnobs,
)
from conveyor.events.metrics import EventMetrics
from conveyor.events.models import EventSettings
from conveyor.events.producers import EventProducers
from conveyor.events.service import EventService
from conveyor.execution.dispatcher import DISPATCHER
from conveyor.execution.seams import STATUS_REPORTER
from conveyor.model.knobs import CLUSTER_KNOBS_BY_NAME
from conveyor.parts import PartKey
from conveyor.runtime.node import Component, Node, NodeSettings
from conveyor.secrets import ORG_SCOPE, SECRETS

EVENTS = PartKey[EventService]("events")
EVENT_PRODUCERS = PartKey[EventProducers]("event_producers")
"""The producers the events hook built; `server` plugs them into the agent hub and the ingest pipeline."""
LIVE_KNOBS = (
    "event_router_max_dispatch_attempts",
    "event_router_event_ttl_seconds",
    "event_router_rate_limit_per_workflow_per_minute",
    "event_max_payload_bytes",
)


class EventsConfig(NodeSettings, Protocol):
    """What the event system reads of the node's configuration (`event_settings`)."""

    events_concurrency: int
    events_lease_seconds: float
    events_poll_seconds: float
    events_scan_seconds: float
    events_cleanup_seconds: float
    events_retry_base_seconds: float
    events_retry_max_seconds: float
    events_max_chain_depth: int
    events_batch_max_runs: int
    cron_tick_seconds: float
    public_url: str | None
    smtp_url: str | None
    smtp_from: str | None


class EventsNode(Node, Protocol):
    """The node as the events hook sees it."""

    @property
    def settings(self) -> EventsConfig: ...


def event_settings(settings: EventsConfig) -> EventSettings:
    """The event system's settings from the server's (YAML file < environment < flags, like every setting),
    the four live knobs at their configured defaults (`refresh_settings` then applies cluster overrides)."""

    def knob(name: str) -> int:
        return int(settings.knob_default(CLUSTER_KNOBS_BY_NAME[name]) or 0)

    return EventSettings(
        lease_seconds=settings.events_lease_seconds,
        retry_base_seconds=settings.events_retry_base_seconds,
        retry_max_seconds=settings.events_retry_max_seconds,
        poll_seconds=settings.events_poll_seconds,
        scan_seconds=settings.events_scan_seconds,
        cleanup_seconds=settings.events_cleanup_seconds,
        concurrency=settings.events_concurrency,
        max_chain_depth=settings.events_max_chain_depth,
        batch_max_runs=settings.events_batch_max_runs,
        cron_tick_seconds=settings.cron_tick_seconds,
        max_attempts=knob("event_router_max_dispatch_attempts"),
        ttl_seconds=knob("event_router_event_ttl_seconds"),
        rate_limit_per_minute=knob("event_router_rate_limit_per_workflow_per_minute"),
        max_payload_bytes=knob("event_max_payload_bytes"),
        public_url=settings.public_url,
        smtp_url=settings.smtp_url,
        smtp_from=settings.smtp_from,
    )


def with_test_hooks(settings: EventSettings, environ: Mapping[str, str]) -> EventSettings:
    """`settings` with the test hooks `CONVEYOR_TEST_EVENT_FAIL_FIRST_N` (JSON `{name: n}`: fail the first n
    attempts of this process on each such event) and `CONVEYOR_TEST_EVENT_STALL` (names whose dispatch stops
    before `finish`), honoured only with `CONVEYOR_TEST_MODE=1`."""
    if environ.get("CONVEYOR_TEST_MODE") != "1":
        return settings
    fail_first = json.loads(environ.get("CONVEYOR_TEST_EVENT_FAIL_FIRST_N") or "{}")
    stall = environ.get("CONVEYOR_TEST_EVENT_STALL") or ""
    return replace(
        settings,
        test_fail_first_n={str(name): int(count) for name, count in fail_first.items()},
        test_stall_names=frozenset(name for name in stall.split(",") if name),
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


async def start(state: EventsNode) -> Sequence[Component]:
    """Publish the `EventService` (`EVENTS`) and its producers (`EVENT_PRODUCERS`, which `server` plugs in) and
    register cron, scan and cleanup."""
    from conveyor.runtime.boot import runtime_services
    from conveyor.runtime.lease import LeaderContext, LeaderTask

    if state.settings.cluster_role != "coordinator":
        return []
    runtime = runtime_services(state.parts)
    settings = with_test_hooks(event_settings(state.settings), os.environ)
    metrics = EventMetrics(state.metrics.registry)

    async def runs_created(_: list[str]) -> None:
        for loop in (state.parts.get(DISPATCHER), state.parts.get(STATUS_REPORTER)):
            if loop is not None:
                loop.wake()

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

    async def org_secret(name: str) -> str | None:
        # Looked up at each delivery: the secrets hook publishes its service independently of this one.
        secrets = state.parts.get(SECRETS)
        if secrets is None:
            return None
        async with state.db.read() as conn:
            return await secrets.reveal(conn, ORG_SCOPE, name)

    service.secret_lookup = org_secret

    def sink(event: str, label: str, rejected: bool) -> None:
        if rejected:
            metrics.rejected.labels(event, label).inc()
        else:
            metrics.emitted.labels(event, label).inc()

    add_metric_sink(sink)
    producers = EventProducers(state.db, settings, metrics, service)

    def knob(name: str) -> Callable[[], Awaitable[int]]:
        configured = CLUSTER_KNOBS_BY_NAME[name]

        async def read() -> int:
            value = await runtime.settings.cluster_value(name)
            return int(value if value is not None else state.settings.knob_default(configured) or 0)

        return read

    round_ms, candidate_ms, cache_max, wait_ms = (
        knob(name) for name in (ROUND_TIMEOUT, CANDIDATE_TIMEOUT, CACHE_MAX, WAIT_TIMEOUT)
    )

    async def global_knobs() -> GlobalKnobs:
        return GlobalKnobs(await round_ms(), await candidate_ms(), await cache_max(), await wait_ms())

    producers.global_evaluator = GlobalEvaluator(
        state.db, global_sources=runtime.settings.global_sources, knobs=global_knobs, environ=os.environ
    )
    state.parts.put(EVENTS, service)
    state.parts.put(EVENT_PRODUCERS, producers)

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
