"""Sends commit statuses or check runs: rows of `status_reports` whose newest version is unsent
(docs/design/execution.md §10)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping

from conveyor.db.engine import Database
from conveyor.execution import reports
from conveyor.ingest import store
from conveyor.ingest.providers.base import Permanent, Retryable, SourceProvider, StatusReport
from conveyor.runtime.loops import WakeableLoop

log = logging.getLogger(__name__)

# The seam through which the artifacts package adds a job's test summary to its check run
# (docs/design/artifacts.md §7): (run_id, job_id or None) -> Markdown, or None. `server.wiring` plugs
# it in, since `ingest` and `artifacts` share a layer and import nothing of each other.
ReportDetails = Callable[[str, str | None], Awaitable[str | None]]

MAX_ATTEMPTS = 8
BACKOFF_S = (5.0, 15.0, 45.0, 120.0, 300.0, 600.0, 600.0, 600.0)


class StatusReporter:
    """A loop sending unsent reports; woken after runs are created or end, polling as a fallback."""

    def __init__(self, db: Database, providers: Mapping[str, SourceProvider], *, poll_s: float) -> None:
        self._db = db
        self._providers = providers
        self._poll_s = poll_s
        self._loop = WakeableLoop("status-reporter", self.send_due, poll_s, log)
        self.details: ReportDetails | None = None

    def wake(self) -> None:
        """Send soon (called after a report row was written)."""
        self._loop.wake()

    async def send_due(self) -> int:
        """Send every due report once; return how many were delivered."""
        async with self._db.read() as conn:
            rows = await reports.unsent_reports(conn)
        sent = 0
        for row in rows:
            async with self._db.read() as conn:
                source = await store.get_source(conn, row["source_id"])
            if source is None:
                continue
            report = StatusReport(
                sha=row["sha"],
                context=row["context"],
                state=row["state"],
                description=row["description"] or "",
                target_url=row["target_url"],
                external_id=row["external_id"],
                extra={"run_id": row["run_id"], "job_id": row["job_id"]},
                details=await self._details(source.report, row),
            )
            try:
                external_id = await self._providers[source.kind].report(source, report)
            except Retryable as exc:
                give_up = row["attempts"] + 1 >= MAX_ATTEMPTS
                delay = BACKOFF_S[min(row["attempts"], len(BACKOFF_S) - 1)]
                async with self._db.transaction() as conn:
                    await reports.mark_failed_attempt(conn, row, delay, give_up)
                log.warning(
                    "status report for %s failed (%s); %s",
                    row["context"],
                    exc,
                    "giving up" if give_up else "will retry",
                )
                continue
            except Permanent as exc:
                async with self._db.transaction() as conn:
                    await reports.mark_failed_attempt(conn, row, 0, True)
                log.warning("status report for %s refused: %s", row["context"], exc)
                continue
            async with self._db.transaction() as conn:
                await reports.mark_sent(conn, row, external_id)
            sent += 1
        return sent

    async def _details(self, report_kind: str | None, row: Mapping[str, object]) -> str | None:
        """What a check run's summary carries beyond its state; a failure to read it never holds the
        report back (it is sent without)."""
        if self.details is None or report_kind != "checks":
            return None
        try:
            return await self.details(
                str(row["run_id"]), None if row["job_id"] is None else str(row["job_id"])
            )
        except Exception as exc:
            log.warning("the details of the report for %s could not be read: %s", row["context"], exc)
            return None

    async def start(self) -> None:
        """Begin sending."""
        await self._loop.start()

    async def stop(self) -> None:
        """Stop sending."""
        await self._loop.stop()
