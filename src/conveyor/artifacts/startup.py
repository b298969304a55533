"""The artifacts start-up hook: open the blob store, publish the service, and register its retention
as a leader task (coordinators only; docs/design/artifacts.md §2, §6)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import timedelta
from typing import Protocol

from conveyor.artifacts.metrics import ArtifactMetrics
from conveyor.artifacts.routes import ARTIFACTS
from conveyor.artifacts.service import ArtifactService
from conveyor.blobs import BlobStore, BlobUrlInvalid, S3Options, open_blob_store, parse_blob_url
from conveyor.blobs.backend import BlobStoreUnavailable
from conveyor.errors import ConveyorError
from conveyor.runtime.node import Component, Node, NodeSettings

log = logging.getLogger(__name__)


class BlobStoreSetupError(ConveyorError):
    """The configured blob store cannot be used (a boot error naming it)."""


class ArtifactSettings(NodeSettings, Protocol):
    """What the artifacts hook reads of the node's configuration."""

    blob_url: str
    blob_s3_endpoint: str | None
    blob_s3_region: str | None
    blob_s3_access_key_id: str | None
    blob_s3_secret_access_key: str | None
    blob_s3_allow_http: bool
    blob_grace_ms: int
    blob_direct_downloads: bool
    retention_interval_ms: int


class ArtifactNode(Node, Protocol):
    """The node as the artifacts hook sees it."""

    @property
    def settings(self) -> ArtifactSettings: ...


async def open_configured_store(settings: ArtifactSettings) -> BlobStore:
    """The blob store `CONVEYOR_BLOB_URL` names, checked once (an S3 bucket must answer)."""
    try:
        location = parse_blob_url(settings.blob_url, settings.home)
    except BlobUrlInvalid as error:
        raise BlobStoreSetupError(str(error)) from None
    blob_store = open_blob_store(
        location,
        S3Options(
            endpoint=settings.blob_s3_endpoint,
            region=settings.blob_s3_region,
            access_key_id=settings.blob_s3_access_key_id,
            secret_access_key=settings.blob_s3_secret_access_key,
            allow_http=settings.blob_s3_allow_http,
        ),
    )
    check = getattr(blob_store, "check", None)
    if check is not None:
        try:
            await check()
        except BlobStoreUnavailable as error:
            raise BlobStoreSetupError(str(error)) from None
    return blob_store


class _Store:
    """Closes the blob store's client at shut-down."""

    def __init__(self, blob_store: BlobStore) -> None:
        self.blob_store = blob_store

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        await self.blob_store.close()


async def start(state: ArtifactNode) -> Sequence[Component]:
    """Publish the `ArtifactService` and its retention (a leader task beside the retention sweep)."""
    from conveyor.runtime.boot import runtime_services
    from conveyor.runtime.lease import LeaderContext, LeaderTask

    if state.settings.cluster_role != "coordinator":
        return []
    # BlobStoreSetupError stops the node: server/wiring.py turns it into a fatal start-up error.
    blob_store = await open_configured_store(state.settings)
    runtime = runtime_services(state.parts)

    async def knob(org_id: str, name: str) -> int:
        return int(await runtime.settings.org_value(org_id, name) or 0)

    service = ArtifactService(
        state.db,
        blob_store,
        knob,
        ArtifactMetrics(state.metrics.registry),
        grace=timedelta(milliseconds=state.settings.blob_grace_ms),
        direct_downloads=state.settings.blob_direct_downloads and blob_store.signs_urls,
    )
    state.parts.put(ARTIFACTS, service)
    log.info("artifacts stored in %s", blob_store.description)

    async def sweep(context: LeaderContext) -> None:
        totals = await service.sweep(context.fence)
        if any(totals.values()):
            log.info("artifact retention deleted %s", totals)

    runtime.leadership.register(LeaderTask("artifact-retention", state.settings.retention_interval_ms, sweep))
    return [_Store(blob_store)]
