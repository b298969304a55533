"""The ingest start-up hooks: providers, the pipeline, the recovery scan and the status reporter.

`publish_intake` runs before the node's identity is settled and lets the webhook route store deliveries
(durably, answered 202) while a restarted node waits; `start` runs after it and starts processing them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from conveyor.db.channels import SOURCE_CHANNEL
from conveyor.db.listen import NotificationListener
from conveyor.execution.dispatcher import DISPATCHER
from conveyor.execution.seams import STATUS_REPORTER
from conveyor.ingest.bounded_cache import CacheBounds
from conveyor.ingest.gate import OrgGate
from conveyor.ingest.pipeline import DeliveryPipeline
from conveyor.ingest.providers.base import SourceProvider
from conveyor.ingest.providers.git import GitProvider
from conveyor.ingest.providers.github import GitHubProvider
from conveyor.ingest.providers.local import LocalProvider
from conveyor.ingest.reporter import StatusReporter
from conveyor.ingest.service import INGEST, INTAKE, DeliveryRecovery, IngestService, SourceSecrets
from conveyor.ingest.source_cache import ALL_SOURCES, SourceCache
from conveyor.model.knobs import CLUSTER_KNOBS_BY_NAME, ORG_KNOBS_BY_NAME
from conveyor.parts import PartKey
from conveyor.runtime.node import Component, Node, NodeSettings
from conveyor.secrets.service import SECRETS


class IngestSettings(NodeSettings, Protocol):
    """What the ingest hook reads of the node's configuration."""

    public_url: str | None
    source_cache_ttl_ms: int


class IngestNode(Node, Protocol):
    """The node as the ingest hook sees it."""

    @property
    def settings(self) -> IngestSettings: ...


@dataclass(frozen=True)
class IngestParts:
    """What `publish_intake` built for `start` to start."""

    service: IngestService
    reporter: StatusReporter


INTAKE_PARTS = PartKey[IngestParts]("ingest.intake_parts")


async def publish_intake(state: IngestNode) -> Sequence[Component]:
    """Build the `IngestService` and offer it to the webhook route only (`INTAKE`), not processing."""
    from conveyor.runtime.boot import boot_services

    if state.settings.cluster_role != "coordinator":
        return []
    runtime = boot_services(state.parts)
    secrets: SourceSecrets = state.parts.need(SECRETS)
    db = state.db

    async def lookup(source_id: str, name: str) -> str | None:
        async with db.read() as conn:
            return await secrets.source_secret(conn, source_id, name)

    providers: dict[str, SourceProvider] = {
        "github": GitHubProvider(lookup),
        "git": GitProvider(Path(state.settings.home) / "git-cache", lookup),
        "local": LocalProvider(),
    }
    reporter = StatusReporter(db, providers, poll_s=state.settings.sweep_interval_ms / 1000)

    async def runs_created(_: list[str]) -> None:
        reporter.wake()
        dispatcher = state.parts.get(DISPATCHER)  # started after ingest; SQLite has no NOTIFY
        if dispatcher is not None:
            dispatcher.wake()

    lock_knob = CLUSTER_KNOBS_BY_NAME["lock_file_max_bytes"]

    async def lock_max_bytes() -> int:
        value = await runtime.settings.cluster_value(lock_knob.name)
        return int(value if value is not None else state.settings.knob_default(lock_knob) or 0)

    async def cluster_knob(name: str) -> int:
        value = await runtime.settings.cluster_value(name)
        return int(
            value if value is not None else state.settings.knob_default(CLUSTER_KNOBS_BY_NAME[name]) or 0
        )

    async def cache_bounds(cache: str) -> CacheBounds:
        # docs/design/execution.md §1.1: `content_cache_*` and `lockfile_cache_*`, read at each use.
        return CacheBounds(
            entries=await cluster_knob(f"{cache}_cache_max"),
            max_bytes=await cluster_knob(f"{cache}_cache_max_bytes"),
            ttl_ms=await cluster_knob(f"{cache}_cache_ttl_ms"),
        )

    pipeline = DeliveryPipeline(
        db,
        providers,
        owner=lambda: runtime.identity.instance_id,
        public_url=state.settings.public_url,
        on_runs_created=runs_created,
        lock_max_bytes=lock_max_bytes,
        cache_bounds=cache_bounds,
        event_log_max_payload_bytes=lambda: cluster_knob("event_log_max_payload_bytes"),
    )
    concurrency_knob = ORG_KNOBS_BY_NAME["ingest_max_concurrency"]

    async def ingest_max_concurrency(org_id: str) -> int | None:
        return await runtime.settings.org_value(org_id, concurrency_knob.name)

    pipeline.gate = OrgGate(ingest_max_concurrency)
    knob = CLUSTER_KNOBS_BY_NAME["max_webhook_payload_bytes"]

    async def max_payload_bytes() -> int:
        return await runtime.settings.cluster_value(knob.name) or int(state.settings.knob_default(knob) or 0)

    service = IngestService(
        db=db,
        pipeline=pipeline,
        secrets=secrets,
        max_payload_bytes=max_payload_bytes,
        home=str(state.settings.home),
        sources=SourceCache(state.settings.source_cache_ttl_ms / 1000),
        processing=False,
    )
    # A source or secret changed here: dropped at this commit. Changed on another coordinator: its NOTIFY
    # (PostgreSQL) drops it here; the cache's TTL bounds how stale an entry can get if that hint is lost.
    db.on_commit_notify(SOURCE_CHANNEL, service.sources.invalidate)
    state.parts.put(INTAKE, service)
    state.parts.put(INTAKE_PARTS, IngestParts(service=service, reporter=reporter))
    return []


async def start(state: IngestNode) -> Sequence[Component]:
    """Publish the `IngestService` as `INGEST` and start processing deliveries: those
    stored while the identity was being settled first (the recovery scan), then each as it arrives."""
    parts = state.parts.get(INTAKE_PARTS)
    if parts is None:
        return []  # not a coordinator
    db, service, reporter = state.db, parts.service, parts.reporter
    recovery = DeliveryRecovery(db, service.pipeline, interval_s=state.settings.sweep_interval_ms / 1000)
    await recovery.start()
    # Only now, with the leases a crashed predecessor of this instance held freed: a delivery processed
    # earlier could have had its fresh lease freed under it.
    service.processing = True
    state.parts.put(INGEST, service)
    await reporter.start()
    state.parts.put(STATUS_REPORTER, reporter)
    components: list[Component] = [recovery, reporter]
    if db.dialect == "postgresql":
        listener = NotificationListener(
            db.url,
            {SOURCE_CHANNEL: lambda source_id: service.sources.invalidate(source_id or ALL_SOURCES)},
            name="source-cache-listener",
            # Whatever was sent while nobody listened is unknown: start over.
            on_connect=lambda: service.sources.invalidate(ALL_SOURCES),
        )
        await listener.start()
        components.append(listener)
    return components
