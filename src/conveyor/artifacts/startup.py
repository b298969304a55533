"""The artifacts start-up hook: open the blob store, publish the service, and register its retention
as a leader task (coordinators only; docs/design/artifacts.md §2, §6)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Protocol

from conveyor.artifacts.metrics import ArtifactMetrics
from conveyor.artifacts.provenance import ProvenanceKeyError, SigningKey, parse_signing_key
from conveyor.artifacts.provenance_service import ProvenanceService
from conveyor.artifacts.routes import ARTIFACTS, PROVENANCE
from conveyor.artifacts.service import ArtifactService
from conveyor.blobs import BlobStore, BlobUrlInvalid, S3Options, open_blob_store, parse_blob_url
from conveyor.blobs.backend import BlobStoreUnavailable
from conveyor.errors import ConveyorError
from conveyor.runtime.node import Component, FatalStartupError, Node, NodeSettings
from conveyor.secrets import write_new_private_file
from conveyor.version import VERSION

log = logging.getLogger(__name__)

# The signing key a coordinator generates when none is configured (docs/design/artifacts.md §9).
GENERATED_PROVENANCE_KEY = "provenance.key"


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
    provenance_key: str | None
    provenance_key_file: Path | None
    public_url: str | None


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


def _read_key_file(path: Path, origin: str) -> SigningKey:
    try:
        text = path.read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError) as exc:
        raise ProvenanceKeyError(f"cannot read the provenance signing key {origin}: {exc}") from None
    return parse_signing_key(text, origin=origin)


def load_signing_key(settings: ArtifactSettings) -> SigningKey:
    """`CONVEYOR_PROVENANCE_KEY` or `_FILE` (not both), else `$CONVEYOR_HOME/provenance.key`, generated
    (PEM, mode 0600) when absent. O_EXCL makes two processes sharing a home agree on one file."""
    value, file = settings.provenance_key, settings.provenance_key_file
    if value and file:
        raise ProvenanceKeyError("set CONVEYOR_PROVENANCE_KEY or CONVEYOR_PROVENANCE_KEY_FILE, not both")
    if file:
        return _read_key_file(file, f"CONVEYOR_PROVENANCE_KEY_FILE ({file})")
    if value:
        return parse_signing_key(value, origin="CONVEYOR_PROVENANCE_KEY")
    path = settings.home / GENERATED_PROVENANCE_KEY
    if path.exists():
        return _read_key_file(path, str(path))
    key = SigningKey.generate()
    if not write_new_private_file(path, key.as_pem()):
        return _read_key_file(path, str(path))
    log.warning(
        "generated a provenance signing key in %s (key id %s); give every coordinator the same key",
        path,
        key.key_id,
        extra={"path": str(path), "key_id": key.key_id},
    )
    return key


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

    try:
        signing_key = load_signing_key(state.settings)
    except ProvenanceKeyError as exc:
        raise FatalStartupError(str(exc)) from None

    def builder_id() -> str:
        if state.settings.public_url:
            return state.settings.public_url.rstrip("/")
        return f"urn:conveyor:instance:{state.instance_id or state.settings.instance_id or 'unknown'}"

    async def cluster_knob(name: str) -> int:
        return int(await runtime.settings.cluster_value(name) or 0)

    provenance = ProvenanceService(state.db, blob_store, signing_key, builder_id, VERSION, cluster_knob)
    await provenance.record_key()
    state.parts.put(PROVENANCE, provenance)
    log.info("provenance statements are signed with key %s", signing_key.key_id)

    async def sweep(context: LeaderContext) -> None:
        totals = await service.sweep(context.fence)
        totals["provenance_statements"] = await provenance.sweep(context.fence)
        if any(totals.values()):
            log.info("artifact retention deleted %s", totals)

    runtime.leadership.register(LeaderTask("artifact-retention", state.settings.retention_interval_ms, sweep))
    return [_Store(blob_store)]
