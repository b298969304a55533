"""Processing a stored delivery: normalise → lock at the SHA → match → runs (docs/design/execution.md §1
"Processing").

Everything here starts from the stored row and is idempotent (runs are unique per delivery and
workflow), so the recovery scan can process a delivery again after a crash without doubling runs.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.db.engine import Database
from conveyor.db.write_batching import WriteBatcher
from conveyor.errors import ConveyorError
from conveyor.execution.creation import RunOrigin, SummonLink, create_run
from conveyor.execution.reports import upsert_report, workflow_context
from conveyor.execution.store import run_of_summon_key
from conveyor.ingest import store
from conveyor.ingest.bounded_cache import MISSING, BoundedCache, CacheBounds
from conveyor.ingest.content_cache import DEFAULT_BOUNDS, ContentCache
from conveyor.ingest.gate import OrgGate
from conveyor.ingest.global_runs import create_global_runs, note_unregistered_globals
from conveyor.ingest.lock_failures import record_lock_invalid
from conveyor.ingest.providers.base import (
    Ignored,
    InvalidRequest,
    ParsedDelivery,
    Refused,
    Retryable,
    SourceProvider,
    SourceRow,
)
from conveyor.ingest.providers.parsing import decode_body, head_commit_message, skip_ci_requested
from conveyor.ingest.truncation import truncated_body, truncation_of
from conveyor.lockfile import Lock, LockReadError, parse_lock
from conveyor.lockfile.reader import MAX_LOCK_BYTES
from conveyor.matching import (
    Event,
    InvalidInputs,
    dispatch_event,
    event_summary,
    lock_digest,
    lock_error_decision,
    match_workflow,
    match_workflows,
    validate_dispatch_inputs,
)
from conveyor.model.approvals import FORK_HOLD, fork_refusal, fork_verdict
from conveyor.model.gitnames import is_commit_id, ref_problem

log = logging.getLogger(__name__)

RETRY_DELAYS_S = (10.0, 30.0, 120.0, 600.0, 1800.0)
# Deliveries processed at once in the background (the rest wait their turn: they are stored, and the
# recovery scan is the backstop). Their leases and outcomes share the batchers' connections; only the
# creation of runs takes a connection per delivery, and at most RUN_CREATION_CONCURRENCY of them do at
# once, so that a burst of webhooks does not take the pool from the hub and the dispatcher.
PROCESS_CONCURRENCY = 16
RUN_CREATION_CONCURRENCY = 8
LEASE_S = 60.0
# Test-only fault injection: exit after a delivery's runs committed and before the delivery is marked
# processed (inert unless set), to prove a second pass counts the runs the first one created.
CRASH_BEFORE_FINISH_VARIABLE = "CONVEYOR_TEST_CRASH_BEFORE_DELIVERY_FINISH"


@dataclass(frozen=True)
class Outcome:
    """What processing one delivery did."""

    status: str
    run_ids: tuple[str, ...] = ()
    detail: str | None = None


@dataclass(frozen=True)
class DeliveryHint:
    """What the request that stored a delivery already holds: its source (from the coordinator's cache)
    and the parsed body. Processing then skips the org read, reads the lock while the lease commits and
    takes the parsed body instead of reading the row back; the source read with the lease (not the
    cached one) is what processing decides on."""

    source: SourceRow
    parsed: ParsedDelivery
    # The body as received: cut to `event_log_max_payload_bytes` once the delivery ended (docs/design/execution.md §1.1).
    body: bytes | None = None


def lock_sha_of(event: Event) -> str | None:
    """The commit whose lock decides the event: the base of a pull request from a fork, else the SHA.

    A fork's pull request is matched against the base repository's lock, never the fork's own.
    """
    if event.sha is None:
        return None
    if event.is_fork:
        base_sha = event.payload.get("pull_request", {}).get("base", {}).get("sha")
        return base_sha if isinstance(base_sha, str) else event.sha
    return event.sha


def _prefetch_done(task: asyncio.Task[Any]) -> None:
    """A failed prefetch is only a hint lost: processing reads (and reports) the lock itself."""
    if not task.cancelled() and task.exception() is not None:
        log.debug("lock prefetch failed: %r", task.exception())


def parsed_from_row(row: Mapping[str, Any]) -> ParsedDelivery:
    """Rebuild the parsed delivery from the stored row, decoding the body as it was received: its stored
    `content-type` says whether it was JSON or GitHub's form encoding. Raises `InvalidRequest`."""
    payload = decode_body(row["headers"] or {}, store.delivery_body(row) or b"{}")
    return ParsedDelivery(
        event=row["event"], delivery_id=row["delivery_id"], action=row["action"], payload=payload
    )


def failure_text(error: BaseException) -> str:
    """What a delivery's `error` says about an exception its processing raised."""
    return f"{type(error).__name__}: {error}"[:2000]


class DeliveryPipeline:
    """Turns deliveries into runs; one instance per process."""

    def __init__(
        self,
        db: Database,
        providers: Mapping[str, SourceProvider],
        *,
        owner: Callable[[], str],
        public_url: str | None = None,
        content_cache: ContentCache[Any] | None = None,
        cache_bounds: Callable[[str], Awaitable[CacheBounds]] | None = None,
        retry_delays_s: tuple[float, ...] = RETRY_DELAYS_S,
        on_runs_created: Callable[[list[str]], Awaitable[None]] | None = None,
        lock_max_bytes: Callable[[], Awaitable[int]] | None = None,
        event_log_max_payload_bytes: Callable[[], Awaitable[int]] | None = None,
        concurrency: int = PROCESS_CONCURRENCY,
    ) -> None:
        self._db = db
        # A delivery's lease and its outcome are small writes: concurrent deliveries share their commits,
        # leases with leases and outcomes with outcomes, the two kinds in transactions of their own so
        # that a commit of outcomes in flight does not hold back the next leases.
        self.leases = WriteBatcher(db)
        self.outcomes = WriteBatcher(db)
        self._slots = asyncio.Semaphore(concurrency)
        self._run_creation = asyncio.Semaphore(RUN_CREATION_CONCURRENCY)
        self._providers = providers
        self._owner = owner
        self._public_url = public_url
        # docs/design/execution.md §1.1: fetched content by immutable ids, parsed locks by their digest.
        self.content_cache: ContentCache[Any] = content_cache or ContentCache()
        self.lockfile_cache: BoundedCache[str, Lock] = BoundedCache("lockfile")
        self._cache_bounds = cache_bounds
        self._retry_delays_s = retry_delays_s
        self._on_runs_created = on_runs_created
        self._lock_max_bytes = lock_max_bytes
        self._event_log_max_payload_bytes = event_log_max_payload_bytes
        # The cut body of each delivery in progress whose body passes `event_log_max_payload_bytes`.
        self._cut_bodies: dict[str, bytes] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._crash_before_finish = bool(os.environ.get(CRASH_BEFORE_FINISH_VARIABLE))
        # The event system's producers (registration sync, generic webhooks), plugged in by the server.
        self.events: Any = None
        # `ingest_max_concurrency` per org (None: no bound), plugged in by the server.
        self.gate: OrgGate | None = None

    async def release_own_leases(self) -> int:
        """Free the leases a previous process of this instance held when it died (no wait for expiry)."""
        async with self._db.transaction() as conn:
            return await store.release_leases(conn, self._owner())

    def kick(self, row_id: str, hint: DeliveryHint | None = None) -> None:
        """Process a just-stored delivery in the background (the recovery scan is the backstop)."""
        task = asyncio.get_running_loop().create_task(self._process_logged(row_id, hint))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def drain(self) -> None:
        """Wait for background processing started by `kick`."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def _process_logged(self, row_id: str, hint: DeliveryHint | None = None) -> None:
        try:
            await self.process_in_slot(row_id, hint)
        except Exception:
            log.exception("processing delivery %s failed; the recovery scan will retry", row_id)

    async def process_in_slot(self, row_id: str, hint: DeliveryHint | None = None) -> Outcome | None:
        """`process` once one of this node's processing slots is free (arrivals and recovery share them)."""
        async with self._slots:
            return await self.process(row_id, hint)

    async def process(self, row_id: str, hint: DeliveryHint | None = None) -> Outcome | None:
        """Lease and process one delivery once its org has a free `ingest_max_concurrency` slot."""
        if self.gate is None:
            return await self._lease_and_process(row_id, hint)
        if hint is not None:
            org_id: str | None = hint.source.org_id  # a delivery belongs to its source's org
        else:
            async with self._db.read() as conn:
                org_id = await store.delivery_org(conn, row_id)
        if org_id is None:
            return None
        async with self.gate.slot(org_id):
            return await self._lease_and_process(row_id, hint)

    def _prefetch_lock(self, hint: DeliveryHint) -> None:
        """Start reading the lock the delivery will need while its lease commits (joined through the cache).

        Only a hint from the request that stored the delivery starts one, inside the org's slot, so a
        fetch is never started for an unauthenticated request nor past `ingest_max_concurrency`.
        """
        source = hint.source
        provider = self._providers.get(source.kind)
        if source.kind == "generic" or provider is None:
            return
        event = provider.normalise(source, hint.parsed, "")
        if isinstance(event, (Ignored, Refused)):
            return
        if event.type == "push" and skip_ci_requested(head_commit_message(event.payload)):
            return
        sha = lock_sha_of(event)
        if sha is None:
            return
        task = asyncio.get_running_loop().create_task(self._read_lock(provider, source, sha))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(_prefetch_done)

    async def _lease_and_process(self, row_id: str, hint: DeliveryHint | None = None) -> Outcome | None:
        """Lease and process one delivery; None when another holder has it or it is done."""
        owner = self._owner()
        if hint is not None:
            try:
                self._prefetch_lock(hint)
            except Exception:  # a payload normalise refuses: processing meets it again and decides
                log.debug("no lock prefetch for delivery %s", row_id, exc_info=True)

        async def lease(conn: AsyncConnection) -> tuple[Mapping[str, Any] | None, SourceRow | None] | None:
            if not await store.lease_delivery(conn, row_id, owner, LEASE_S):
                return None
            if hint is not None:  # the request that stored the row parsed this very body
                return None, await store.get_source(conn, hint.source.id)
            row = await store.get_delivery(conn, row_id)
            assert row is not None
            return row, await store.get_source(conn, row["source_id"])

        leased = await self.leases.run(lease)
        if leased is None:
            return None
        row, source = leased
        body = hint.body if hint is not None else store.delivery_body(row or {})
        if body is not None and self._event_log_max_payload_bytes is not None:
            cut = truncated_body(body, await self._event_log_max_payload_bytes())
            if cut is not None:  # stored with the delivery's end, in its last transaction
                self._cut_bodies[row_id] = cut
        try:
            return await self._process_leased(row_id, owner, hint, row, body, source)
        finally:
            self._cut_bodies.pop(row_id, None)

    async def _process_leased(
        self,
        row_id: str,
        owner: str,
        hint: DeliveryHint | None,
        row: Mapping[str, Any] | None,
        body: bytes | None,
        source: SourceRow | None,
    ) -> Outcome:
        # From here the delivery is leased: whatever goes wrong is recorded on it (its error and attempt
        # count), so it is retried with back-off and ends `failed`, and never ends a recovery round.
        if hint is None and body is not None and (cut := truncation_of(body)) is not None:
            # docs/design/execution.md §1.1: a cut body put back to `received` is never half-processed.
            return await self._finish(row_id, owner, status="failed", detail=cut.reason(), error=cut.reason())
        try:
            parsed = hint.parsed if hint is not None else parsed_from_row(row or {})
        except InvalidRequest as exc:  # stored by a build that accepted it: no retry will decode it
            detail = f"the stored body cannot be decoded: {exc}"
            return await self._finish(row_id, owner, status="failed", detail=detail, error=detail)
        if source is None:
            return await self._finish(row_id, owner, status="ignored", detail="source removed")
        try:
            return await self._process(row_id, parsed, source, owner)
        except Retryable as exc:
            return await self._retry_later(row_id, owner, str(exc))
        except Exception as exc:
            log.exception("processing delivery %s failed", row_id)
            return await self._retry_later(row_id, owner, failure_text(exc))

    async def _retry_later(self, row_id: str, owner: str, error: str) -> Outcome:
        """Record a failed attempt: back off, or end `failed` after the last delay."""
        async with self._db.transaction() as conn:
            status = await store.retry_delivery_later(
                conn, row_id, owner, error=error, delays_s=self._retry_delays_s
            )
        log.warning("delivery %s: attempt failed (%s), now %s", row_id, error, status)
        return Outcome(status=status, detail=error)

    async def _process(self, row_id: str, parsed: ParsedDelivery, source: SourceRow, owner: str) -> Outcome:
        if source.kind == "generic":
            return await self._generic(row_id, owner, source, parsed)
        provider = self._providers[source.kind]
        normalised = provider.normalise(source, parsed, row_id)
        if isinstance(normalised, Ignored):
            return await self._finish(row_id, owner, status="ignored", detail=normalised.reason)
        if isinstance(normalised, Refused):
            reason = f"refused: {normalised.reason}"
            log.warning("delivery %s of source %s %s", row_id, source.id, reason)
            return await self._finish(
                row_id,
                owner,
                status="failed",
                detail=reason,
                decisions={"refused": normalised.reason},
                error=reason,
            )
        event = normalised
        if event.sha is None:
            return await self._finish(row_id, owner, status="ignored", detail="ref deleted")
        if event.type == "push" and skip_ci_requested(head_commit_message(event.payload)):
            return await self._finish(row_id, owner, status="processed", skipped="skip-ci")
        if fork_verdict(event.is_fork, source.fork_pull_requests) == "refuse":
            # docs/design/approvals.md §6: nothing is fetched or run for a refused fork.
            reason = fork_refusal(source.fork_pull_requests)
            return await self._finish(
                row_id, owner, status="processed", skipped="fork", decisions={"refused": reason}, error=reason
            )
        lock_sha = lock_sha_of(event)
        assert lock_sha is not None
        try:
            raw, limit = await self._read_lock(provider, source, lock_sha)
            if raw is None:
                self._sync_skipped(source, event)
                decision = lock_error_decision(event, "lock_missing")
                return await self._finish(row_id, owner, status="lock_missing", decisions=decision.as_dict())
            lock, digest = await self._parse_lock(raw, limit)
        except LockReadError as exc:
            self._sync_skipped(source, event)
            run_id = await record_lock_invalid(
                self._db, row_id, owner, source, event, exc, self._cut_bodies.get(row_id)
            )
            return Outcome("lock_invalid", (run_id,), str(exc))
        if event.changed_files is None and event.type == "push" and event.before:
            files = await self._changed_files(provider, source, event)
            if files is not None:
                event = event.model_copy(update={"changed_files": files})
        # The content hash keys the parsed lock and lets deliveries share one trigger index.
        return await self._create_runs(row_id, owner, source, event, lock, digest)

    async def _bounds(self, cache: str) -> CacheBounds:
        """The live bounds of the `content` or `lockfile` cache (its three cluster knobs)."""
        return await self._cache_bounds(cache) if self._cache_bounds is not None else DEFAULT_BOUNDS

    async def _parse_lock(self, raw: bytes, limit: int) -> tuple[Lock, str]:
        """The parsed lock of `raw` and its digest, through the lock-file cache; raises `LockReadError`.

        A lock over `limit` is refused before the cache is asked, so a lowered `lock_file_max_bytes`
        applies to a lock parsed under a higher one.
        """
        digest = lock_digest(raw)
        bounds = await self._bounds("lockfile")
        if len(raw) <= limit:
            found = self.lockfile_cache.get(digest, bounds)
            if found is not MISSING:
                assert isinstance(found, Lock)
                return found, digest
        lock = parse_lock(raw, limit)
        self.lockfile_cache.put(digest, lock, len(raw), bounds)
        return lock, digest

    async def _changed_files(
        self, provider: SourceProvider, source: SourceRow, event: Event
    ) -> list[str] | None:
        """The files a push changed; a provider that fetches them (GitHub's compare API) goes through the
        content cache, keyed by the two commit ids."""
        if not getattr(provider, "fetches_changed_files", False):
            return await provider.changed_files(source, event)
        key = ("changed", source.id, source.repo, event.repo, event.before, event.sha)
        files: list[str] | None = await self.content_cache.get(
            key, lambda: provider.changed_files(source, event), await self._bounds("content")
        )
        return None if files is None else list(files)

    async def _read_lock(
        self, provider: SourceProvider, source: SourceRow, sha: str
    ) -> tuple[bytes | None, int]:
        """The lock at `sha` (through the cache) and the `lock_file_max_bytes` it was read under.

        A lock over the limit raises `LockTooLarge` before more than the limit is read.
        """
        limit = await self._lock_max_bytes() if self._lock_max_bytes is not None else MAX_LOCK_BYTES
        key = ("lock", source.id, source.repo, sha)
        fetch = lambda: provider.fetch_lock(source, sha, max_bytes=limit)  # noqa: E731
        raw: bytes | None = await self.content_cache.get(key, fetch, await self._bounds("content"))
        return raw, limit

    async def _create_runs(
        self, row_id: str, owner: str, source: SourceRow, event: Event, lock: Lock, digest: str
    ) -> Outcome:
        decision = match_workflows(lock, event, digest=digest)
        trace = decision.as_dict()
        created: list[str] = []
        held = FORK_HOLD if fork_verdict(event.is_fork, source.fork_pull_requests) == "hold" else None
        origin = RunOrigin(
            org_id=source.org_id,
            source_id=source.id,
            routing_key=source.routing_key,
            delivery_id=row_id,
            held=held,
        )
        for name in decision.matched:
            workflow = lock.workflow(name)
            assert workflow is not None
            workflow_trace = next((w.as_dict() for w in decision.workflows if w.workflow == name), None)
            async with self._run_creation, self._db.transaction() as conn:
                run = await create_run(
                    conn,
                    origin=origin,
                    workflow=workflow,
                    event=event,
                    trigger_trace={"event": trace["event"], "workflow": workflow_trace},
                )
                if run is not None:
                    await self._report_pending(conn, source, event, run.id, name)
                    created.append(run.id)
        # The runs are committed: dispatch need not wait for the registrations' sync and the delivery's
        # finish (a crash in between re-processes the delivery, which finds the runs already there).
        if created and self._on_runs_created:
            await self._on_runs_created(created)
        # docs/design/global_workflows.md §4: the org's global workflows, after the own runs are dispatched.
        expected = len(decision.matched)
        round_ = await self.events.global_round(source, event) if self.events is not None else None
        if round_ is not None:
            trace.update({"global": round_.trace, "skipped_global": round_.skipped})
            expected += len(round_.matched)
            more = await create_global_runs(
                self._db,
                self._run_creation,
                self._report_pending,
                source,
                origin,
                event,
                trace,
                round_.matched,
            )
            if more and self._on_runs_created:
                await self._on_runs_created(more)
            created.extend(more)
        default = event.default_branch or source.default_branch
        sync = self.events is not None and event.type == "push" and bool(default) and event.branch == default
        if event.type == "push" and not sync:
            note_unregistered_globals(trace, lock, source.routing_key, default, event.branch)
        if self._crash_before_finish:
            log.warning(
                "%s is set: exiting after the runs committed, before the delivery's finish",
                CRASH_BEFORE_FINISH_VARIABLE,
            )
            os._exit(137)

        # A pass after a crash finds the earlier pass's runs already there (create_run returns None):
        # the count is of the runs that exist for the delivery, whichever pass created them. Only such
        # a pass pays for counting them; a first pass created every matched run itself. The
        # registrations' sync (a savepoint of its own) commits with the finish: one write, not two.
        async def finish(conn: AsyncConnection) -> None:
            if sync:
                await self.events.sync_push(conn, source, event.sha, lock)
            run_count = len(created)
            if run_count < expected:
                run_count = await store.count_delivery_runs(conn, row_id)
            await store.finish_delivery(
                conn,
                row_id,
                owner,
                status="processed",
                decisions=trace,
                run_count=run_count,
                cut_body=self._cut_bodies.get(row_id),
            )

        await self.outcomes.run(finish)
        return Outcome("processed", tuple(created))

    def _sync_skipped(self, source: SourceRow, event: Event) -> None:
        """A default-branch push without a usable lock leaves registrations alone (counted)."""
        default = event.default_branch or source.default_branch
        if self.events is not None and event.type == "push" and default and event.branch == default:
            self.events.sync_skipped()

    async def _generic(self, row_id: str, owner: str, source: SourceRow, parsed: ParsedDelivery) -> Outcome:
        """A `generic` delivery becomes `__generic_webhook` in its last transaction
        (docs/design/execution.md §1)."""
        if self.events is None:
            return await self._finish(row_id, owner, status="ignored", detail="events are not enabled")
        async with self._db.transaction() as conn:
            await self.events.generic_delivery(conn, source, row_id, parsed)
            await store.finish_delivery(
                conn,
                row_id,
                owner,
                status="processed",
                decisions={"generic_webhook": parsed.action},
                cut_body=self._cut_bodies.get(row_id),
            )
        return Outcome("processed")

    async def _report_pending(
        self, conn: Any, source: SourceRow, event: Event, run_id: str, workflow: str
    ) -> None:
        if source.report == "none" or event.sha is None:
            return
        await upsert_report(
            conn,
            source_id=source.id,
            sha=event.sha,
            context=workflow_context(workflow),
            run_id=run_id,
            job_id=None,
            status="queued",
            target_url=f"{self._public_url}/ui/runs/{run_id}" if self._public_url else None,
        )

    async def _finish(
        self, row_id: str, owner: str, *, status: str, detail: str | None = None, **values: Any
    ) -> Outcome:
        decisions = values.pop("decisions", None)
        if decisions is None and detail is not None:
            decisions = {"ignored": detail}

        async def finish(conn: AsyncConnection) -> None:
            await store.finish_delivery(
                conn,
                row_id,
                owner,
                status=status,
                decisions=decisions,
                cut_body=self._cut_bodies.get(row_id),
                **values,
            )

        await self.outcomes.run(finish)
        return Outcome(status, (), detail or values.get("skipped"))

    async def clone_credential(self, source: SourceRow) -> str | None:
        """The `Authorization` header value agents clone with (None when the source needs none)."""
        get = getattr(self._providers.get(source.kind), "clone_credential", None)
        return await get(source) if get is not None else None

    async def default_branch_lock(self, source: SourceRow) -> tuple[str, Lock]:
        """The SHA of the source's default branch and its lock (registration refresh); `ManualRunError`."""
        branch = source.default_branch or "main"
        if (problem := ref_problem(branch)) is not None:
            raise ManualRunError("invalid_ref", f"the default branch {problem}")
        return await self._lock_at(source, branch, f"{branch} is not a branch of {source.name}")

    async def lock_at_ref(self, source: SourceRow, ref: str | None) -> tuple[str, str, Lock]:
        """The branch (or commit) a manual run of `ref` would use, its SHA and its lock: what
        `start_manual_run` validates against (docs/design/execution.md §8.5); `ManualRunError`."""
        branch = (ref or source.default_branch or "main").removeprefix("refs/heads/")
        if not is_commit_id(branch) and (problem := ref_problem(branch)) is not None:
            raise ManualRunError("invalid_ref", f"ref {problem}")
        sha, lock = await self._lock_at(
            source, branch, f"{branch} is not a branch or commit of {source.name}"
        )
        return branch, sha, lock

    async def _lock_at(
        self, source: SourceRow, branch: str, unknown: str, pinned: str | None = None
    ) -> tuple[str, Lock]:
        """Resolve `branch` to a SHA (unless `pinned` to one) and read its lock; `ManualRunError` (`unknown`:
        the message of an unknown ref)."""
        provider = self._providers.get(source.kind)
        if provider is None:  # a `generic` source receives webhooks of non-git systems: no repository
            raise ManualRunError(
                "no_repository", f"a {source.kind} source has no repository to read a lock from"
            )
        try:
            sha = pinned or await provider.resolve_ref(source, branch)
        except Retryable as exc:
            raise ManualRunError("ref_unresolved", f"cannot resolve {branch}: {exc}") from exc
        if sha is None:
            raise ManualRunError("unknown_ref", unknown)
        try:
            raw, limit = await self._read_lock(provider, source, sha)
            if raw is None:
                raise ManualRunError("lock_missing", f"commit {sha[:12]} has no .conveyor/conveyor.lock.json")
            return sha, (await self._parse_lock(raw, limit))[0]
        except LockReadError as exc:
            raise ManualRunError(exc.code, str(exc)) from exc

    async def start_manual_run(
        self,
        source: SourceRow,
        *,
        workflow: str,
        ref: str | None,
        inputs: Mapping[str, Any],
        sender: str | None,
        audit: Callable[[Any, str], Awaitable[None]],
        triggered_by: str | None = None,
        summon: SummonLink | None = None,
    ) -> dict[str, Any]:
        """Run `workflow` of `source` at `ref` through its `dispatch` trigger
        (docs/design/authoring.md §2.6); `triggered_by`: the token that asked (docs/design/approvals.md §1); `summon`:
        a summoned run's link (docs/design/execution.md §8.6)."""
        if summon is not None and summon.sha is not None:  # at the summoner's commit
            sha, lock = await self._lock_at(source, "", "", pinned=summon.sha)
            branch = summon.branch or source.default_branch or "main"
        else:
            branch, sha, lock = await self.lock_at_ref(source, ref)
        entry = lock.workflow(workflow)
        if entry is None:
            raise ManualRunError("unknown_workflow", f"the lock at {sha[:12]} has no workflow {workflow}")
        dispatch = entry.dispatch_trigger()
        if dispatch is None:
            raise ManualRunError("not_dispatchable", f"workflow {workflow} has no dispatch trigger")
        try:
            values = validate_dispatch_inputs(dispatch.inputs, inputs)
        except InvalidInputs as exc:
            raise ManualRunError("invalid_inputs", str(exc)) from exc
        event = dispatch_event(
            repo=source.name if source.kind == "local" else source.repo,
            inputs=values,
            branch=branch,
            default_branch=source.default_branch,
            sha=sha,
            source=source.kind,
            sender=sender,
        )
        decision = match_workflow(entry, event)
        if not decision.matched:
            raise ManualRunError(
                "not_dispatchable", f"workflow {workflow}'s dispatch trigger does not accept this run"
            )
        origin = RunOrigin(
            org_id=source.org_id,
            source_id=source.id,
            routing_key=source.routing_key,
            triggered_by=triggered_by,
            **(summon.origin_fields() if summon else {}),
        )
        async with self._db.transaction() as conn:
            run = await create_run(
                conn,
                origin=origin,
                workflow=entry,
                event=event,
                trigger_trace={"event": event_summary(event), "workflow": decision.as_dict()},
            )
            if run is None:  # a summon resent with the same key: the run its first attempt started
                existing = await run_of_summon_key(conn, summon.key if summon else "")
                return {**(existing or {}), "sha": sha, "inputs": values, "created": False}
            await self._report_pending(conn, source, event, run.id, workflow)
            await audit(conn, run.id)
        if self._on_runs_created:
            await self._on_runs_created([run.id])
        return {
            "id": run.id,
            "number": run.number,
            "workflow": workflow,
            "status": run.status,
            "sha": sha,
            "inputs": values,
            "jobs": run.job_ids,
            "created": True,
        }


class ManualRunError(ConveyorError):
    """A manual run cannot start; `code` is the API error code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
