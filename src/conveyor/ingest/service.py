"""The ingest service a server holds: providers, the pipeline, secrets, limits, and the recovery scan."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from fastapi import Request
from fastapi.responses import JSONResponse
from sqlalchemy.ext.asyncio import AsyncConnection
from starlette.background import BackgroundTask

from conveyor.db.engine import Database
from conveyor.http.parts import parts_of
from conveyor.ingest import store
from conveyor.ingest.batching import DeliveryWriter
from conveyor.ingest.pipeline import DeliveryHint, DeliveryPipeline, ManualRunError
from conveyor.ingest.providers.base import SourceRow
from conveyor.ingest.source_cache import SourceCache
from conveyor.ingest.store import NewDelivery
from conveyor.model.errors import ApiError
from conveyor.model.ids import utc_now
from conveyor.parts import PartKey
from conveyor.runtime.loops import WakeableLoop

__all__ = ["DeliveryRecovery", "IngestService", "ManualRunError", "ingest_service", "webhook_intake"]

log = logging.getLogger(__name__)


class SourceSecrets(Protocol):
    """The part of the secret store ingest uses (scope `source:<id>`), in the caller's transaction."""

    async def source_secret(self, conn: AsyncConnection, source_id: str, name: str) -> str | None:
        """One secret of a source."""
        ...

    async def set_source_secret(
        self, conn: AsyncConnection, source_id: str, name: str, value: str, *, updated_by: str | None
    ) -> object:
        """Store one secret of a source."""
        ...

    async def delete_source_secrets(self, conn: AsyncConnection, source_id: str) -> int:
        """Delete every secret of a source."""
        ...


# Test-only fault injection: kill the process right after a delivery commits (inert unless set).
CRASH_AFTER_COMMIT_VARIABLE = "CONVEYOR_TEST_CRASH_AFTER_DELIVERY_COMMIT"


@dataclass
class IngestService:
    """What the webhook and source routes need."""

    db: Database
    pipeline: DeliveryPipeline
    secrets: SourceSecrets
    max_payload_bytes: Callable[[], Awaitable[int]]
    home: str
    sources: SourceCache = field(default_factory=SourceCache)
    writer: DeliveryWriter = field(init=False)
    crash_after_commit: bool = field(
        default_factory=lambda: bool(os.environ.get(CRASH_AFTER_COMMIT_VARIABLE))
    )
    # False while the node's identity is being settled: a delivery is stored and answered, and the recovery
    # scan that starts with processing takes it (docs/design/cluster.md §1).
    processing: bool = True

    def __post_init__(self) -> None:
        self.writer = DeliveryWriter(self.db)

    async def store_delivery(self, delivery: NewDelivery) -> tuple[str, bool]:
        """Store a verified webhook delivery with group commit: (row id, created) once its row is durable."""
        return await self.writer.store(delivery)

    async def secret(self, source_id: str, name: str) -> str | None:
        """A source's secret, read in its own transaction."""
        async with self.db.read() as conn:
            return await self.secrets.source_secret(conn, source_id, name)

    async def webhook_source(self, source_id: str) -> tuple[SourceRow | None, list[str]]:
        """The source and its webhook secrets (current, then next): the webhook route's hot path, so
        served from the coordinator's `SourceCache` and otherwise read on one connection."""
        cached = self.sources.get(source_id)
        if cached is not None:
            return cached.source, list(cached.secrets)
        token = self.sources.begin_load()
        async with self.db.read() as conn:
            source = await store.get_source(conn, source_id)
            found: list[str | None] = []
            if source is not None and source.enabled:
                found = [
                    await self.secrets.source_secret(conn, source.id, name)
                    for name in ("webhook_secret", "webhook_secret_next")
                ]
        secrets = tuple(s for s in found if s)
        self.sources.put(source_id, source, secrets, token)
        return source, list(secrets)

    async def start_manual_run(
        self,
        source: SourceRow,
        *,
        workflow: str,
        ref: str | None,
        inputs: dict[str, Any],
        sender: str | None,
        audit: Callable[[Any, str], Awaitable[None]],
        triggered_by: str | None = None,
    ) -> dict[str, Any]:
        """A manual `dispatch` run (raises `ManualRunError`); `triggered_by` is the caller's token id."""
        return await self.pipeline.start_manual_run(
            source,
            workflow=workflow,
            ref=ref,
            inputs=inputs,
            sender=sender,
            audit=audit,
            triggered_by=triggered_by,
        )

    def accepted(self, row_id: str, hint: DeliveryHint | None = None) -> JSONResponse:
        """The 202 for a stored delivery; processing starts once the answer is sent.

        The test-only fault-injection point sits here: with it armed the process dies after the
        202 and before processing, so only the recovery scan can pick the delivery up.
        """

        async def after_answer() -> None:
            if self.crash_after_commit:
                log.warning(
                    "%s is set: exiting after the 202, before processing", CRASH_AFTER_COMMIT_VARIABLE
                )
                os._exit(137)
            if self.processing:
                self.pipeline.kick(row_id, hint)

        return JSONResponse(
            {"status": "accepted", "delivery": row_id},
            status_code=202,
            background=BackgroundTask(after_answer),
        )


async def ingest_service(request: Request) -> IngestService:
    """The server's ingest service (503 while it is not started). Async, although it awaits nothing: FastAPI
    runs a plain function dependency on a worker thread, a thread hop on every webhook."""
    service = parts_of(request).get(INGEST)
    if service is None:
        raise ApiError(503, "unavailable", "ingest is not ready yet")
    return service


async def webhook_intake(request: Request) -> IngestService:
    """The service the webhook route stores with: the started one, else the one published before the node's
    identity is settled (stores, does not process yet); 503 before either."""
    parts = parts_of(request)
    service = parts.get(INGEST) or parts.get(INTAKE)
    if service is None:
        raise ApiError(503, "unavailable", "ingest is not ready yet")
    return service


# The started service (processing deliveries), and the one `publish_intake` offers the webhook route before
# the node's identity is settled (storing, not processing): `ingest/startup.py`.
INGEST = PartKey[IngestService]("ingest")
INTAKE = PartKey[IngestService]("ingest.intake")


class DeliveryRecovery:
    """Processes deliveries stored but not processed: at start and then periodically.

    Each delivery carries its own lease, so running this on every coordinator is safe.
    """

    def __init__(self, db: Database, pipeline: DeliveryPipeline, interval_s: float) -> None:
        self._db = db
        self._pipeline = pipeline
        self._loop = WakeableLoop("delivery-recovery", self._scan_logged, interval_s, log)

    async def scan_once(self) -> int:
        """Process every due delivery now; return how many were taken."""
        taken = 0
        while True:
            async with self._db.read() as conn:
                due = await store.due_deliveries(conn, utc_now())
            # Side by side, in the slots arrivals take: one at a time, a backlog left by a crash (each
            # delivery waiting on its fetch and its commits) drained at a delivery or two per second.
            processed = sum(await asyncio.gather(*(self._recover(row_id) for row_id in due)))
            taken += processed
            if processed == 0:
                return taken

    async def _recover(self, row_id: str) -> bool:
        """Process one due delivery in a pipeline slot; True when this node took it."""
        try:
            outcome = await self._pipeline.process_in_slot(row_id)
        except Exception:
            # The pipeline records what fails once it holds the lease; this is what failed before
            # (reading the row, the org's gate) or while recording it. The others go on.
            log.exception("recovering delivery %s failed; it stays due", row_id)
            return False
        return outcome is not None

    async def start(self) -> None:
        """Free this instance's leases left by a crashed process, then scan now and every interval."""
        freed = await self._pipeline.release_own_leases()
        if freed:
            log.info("released %d delivery leases held by a previous process of this instance", freed)
        await self._loop.start()

    async def stop(self) -> None:
        """Stop scanning and wait for background processing."""
        await self._loop.stop()
        await self._pipeline.drain()

    async def _scan_logged(self) -> None:
        count = await self.scan_once()
        if count:
            log.info("recovery scan processed %d deliveries", count)
