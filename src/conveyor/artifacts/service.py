"""Artifacts of runs (docs/design/artifacts.md §4, §6): the job credential's checks, uploads and their
commit, downloads, test reports and retention. Routes stay thin and call this."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.artifacts import store
from conveyor.artifacts.metrics import ArtifactMetrics
from conveyor.artifacts.ranges import ByteRange
from conveyor.blobs import BlobCorrupt, BlobInfo, BlobMismatch, BlobStore, BlobSweep, BlobTooLarge
from conveyor.blobs import store as blob_rows
from conveyor.db.engine import Database
from conveyor.execution.queue import job_of_token
from conveyor.model.artifact_names import name_problem
from conveyor.model.errors import ApiError, conflict, not_found
from conveyor.model.ids import new_id, utc_now
from conveyor.model.job_tokens import looks_like_job_token
from conveyor.model.tokens import hash_token

log = logging.getLogger(__name__)

# Retention works in batches of this many rows, each its own transaction.
BATCH = 500
# A presigned download URL is used at once by the agent that asked; minutes leave room for a slow start.
DIRECT_URL_TTL = timedelta(minutes=5)
MAX_FAILURES = 50
MAX_MESSAGE = 500

KnobReader = Callable[[str, str], Awaitable[int]]


def invalid_token(detail: str = "the job credential is unknown or its job has ended") -> ApiError:
    """401 for a credential that is not a live job's."""
    return ApiError(401, "invalid_token", detail)


@dataclass
class ArtifactService:
    """What the artifact routes and the retention sweep use."""

    db: Database
    blob_store: BlobStore
    # (org_id, knob) → its effective value (org > cluster > env default).
    knob: KnobReader
    metrics: ArtifactMetrics
    grace: timedelta
    clock: Callable[[], datetime] = utc_now
    # CONVEYOR_BLOB_DIRECT_DOWNLOADS: agents may be sent to the object store for a whole blob.
    direct_downloads: bool = False

    # -- the credential -----------------------------------------------------------------------------

    async def authenticate(self, authorization: str | None, job_id: str) -> store.JobScope:
        """The job a `Bearer cvy_job_…` header is good for; 401 when it is no live credential, 403 when it
        belongs to another job."""
        scheme, _, token = (authorization or "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise ApiError(
                401, "unauthenticated", "send the job's credential as Authorization: Bearer cvy_job_…"
            )
        if not looks_like_job_token(token):
            raise invalid_token("this is not a job credential (cvy_job_…)")
        async with self.db.read() as conn:
            holder = await job_of_token(conn, hash_token(token))
            if holder is None:
                raise invalid_token()
            if holder != job_id:
                raise ApiError(403, "forbidden", "this credential belongs to another job")
            scope = await store.job_scope(conn, job_id)
        if scope is None:
            raise invalid_token()
        return scope

    # -- upload and commit --------------------------------------------------------------------------

    async def upload(
        self,
        scope: store.JobScope,
        chunks: AsyncIterable[bytes],
        declared: int | None,
        limit_knob: str = "artifact_max_bytes",
        expected: str | None = None,
    ) -> dict[str, Any]:
        """Store an upload's bytes as a blob (not visible yet); `{upload_id, sha256, size}`. A cache entry's
        upload is bounded by `cache_max_entry_bytes` instead (docs/design/caches.md §6). `expected`: the
        digest the agent announced, which lets an object store write the blob's key directly (409
        `digest_mismatch` when the bytes hash otherwise)."""
        limit = await self.knob(scope.org_id, limit_knob)
        if declared is not None and declared > limit:
            self.metrics.uploads.labels("refused").inc()
            raise too_large(limit, limit_knob)

        async def mark_live(info: BlobInfo) -> None:
            async with self.db.transaction() as conn:
                await blob_rows.mark_live(conn, info.sha256, info.size, self.clock())

        try:
            info = await self.blob_store.put(
                _counted(chunks, self.metrics), max_bytes=limit, before_place=mark_live, expected=expected
            )
        except BlobTooLarge:
            self.metrics.uploads.labels("refused").inc()
            raise too_large(limit, limit_knob) from None
        except BlobMismatch as error:
            self.metrics.uploads.labels("failed").inc()
            raise ApiError(409, "digest_mismatch", f"nothing was stored: {error}") from None
        except BaseException:
            self.metrics.uploads.labels("failed").inc()
            raise
        upload_id = new_id()
        async with self.db.transaction() as conn:
            await store.record_upload(
                conn,
                {
                    "id": upload_id,
                    "job_id": scope.job_id,
                    "run_id": scope.run_id,
                    "sha256": info.sha256,
                    "size": info.size,
                    "created_at": self.clock(),
                },
            )
        return {"upload_id": upload_id, "sha256": info.sha256, "size": info.size}

    async def commit(self, scope: store.JobScope, body: dict[str, Any]) -> dict[str, Any]:
        """Make an upload the run's artifact `body["name"]` once its digest and size agree."""
        name = body["name"]
        problem = name_problem(name)
        if problem is not None:
            raise ApiError(400, "invalid_name", problem)
        run_max = await self.knob(scope.org_id, "artifact_run_max_bytes")
        keep_days = await self.knob(scope.org_id, "artifact_retention_days")
        now = self.clock()
        days = retention_days(body.get("retention_days"), keep_days)
        async with self.db.transaction() as conn:
            upload = await take_committed_upload(conn, scope, body, "artifact")
            await store.lock_run(conn, scope.run_id)
            if await store.name_taken(conn, scope.run_id, name):
                raise conflict(
                    "artifact_exists", f"run {scope.run_id} already has an artifact named {name!r}"
                )
            count, used = await store.run_usage(conn, scope.run_id)
            if count >= store.MAX_ARTIFACTS_PER_RUN:
                raise conflict(
                    "too_many_artifacts", f"a run holds at most {store.MAX_ARTIFACTS_PER_RUN} artifacts"
                )
            if used + upload["size"] > run_max:
                raise ApiError(
                    413,
                    "run_quota_exceeded",
                    f"the run's artifacts would take {used + upload['size']} bytes; "
                    f"artifact_run_max_bytes is {run_max}",
                )
            row = {
                "id": new_id(),
                "org_id": scope.org_id,
                "run_id": scope.run_id,
                "job_id": scope.job_id,
                "routing_key": scope.routing_key,
                "name": name,
                "format": body["format"],
                "filename": body.get("filename"),
                "size": upload["size"],
                "blob_sha256": upload["sha256"],
                "file_count": body.get("file_count", 1),
                "created_at": now,
                "expires_at": None if days is None else now + timedelta(days=days),
            }
            await store.insert_artifact(conn, row)
        self.metrics.uploads.labels("committed").inc()
        self.metrics.stored_bytes.inc(row["size"])
        return row

    async def record_test_report(self, scope: store.JobScope, body: dict[str, Any]) -> dict[str, Any]:
        """A JUnit summary of one of the run's artifacts."""
        async with self.db.transaction() as conn:
            artifact = await store.artifact_named(conn, scope.run_id, body["artifact"])
            if artifact is None:
                raise not_found(f"artifact {body['artifact']!r} of run {scope.run_id}")
            row = {
                "id": new_id(),
                "run_id": scope.run_id,
                "job_id": scope.job_id,
                "artifact_id": artifact["id"],
                "name": body["artifact"],
                "passed": body["passed"],
                "failed": body["failed"],
                "skipped": body["skipped"],
                "errors": body["errors"],
                "failures": [
                    {
                        "name": str(f.get("name", ""))[:MAX_MESSAGE],
                        "message": str(f.get("message", ""))[:MAX_MESSAGE],
                    }
                    for f in body.get("failures", [])[:MAX_FAILURES]
                ],
                "created_at": self.clock(),
            }
            await store.insert_test_report(conn, row)
        return row

    # -- reads --------------------------------------------------------------------------------------

    async def list_run(self, run_id: str) -> list[dict[str, Any]]:
        """The run's artifacts."""
        async with self.db.read() as conn:
            return await store.artifacts_of_run(conn, run_id)

    async def find(self, run_id: str, name: str) -> dict[str, Any]:
        """One artifact, or 404."""
        async with self.db.read() as conn:
            found = await store.artifact_named(conn, run_id, name)
        if found is None:
            self.metrics.downloads.labels("missing").inc()
            raise not_found(f"artifact {name!r} of run {run_id}")
        return found

    async def content(self, artifact: dict[str, Any], byte_range: ByteRange | None) -> AsyncIterator[bytes]:
        """The artifact's bytes (a range, or all of them checked against the digest)."""
        start, end = (0, None) if byte_range is None else (byte_range.start, byte_range.end)
        served = 0
        try:
            async for chunk in self.blob_store.get(artifact["blob_sha256"], start=start, end=end):
                served += len(chunk)
                yield chunk
        except BlobCorrupt:
            self.metrics.downloads.labels("corrupt").inc()
            log.error(
                "artifact %s of run %s: its blob fails its digest", artifact["name"], artifact["run_id"]
            )
            raise
        finally:
            self.metrics.download_bytes.inc(served)
        self.metrics.downloads.labels("served" if byte_range is None else "partial").inc()

    async def direct_url(self, sha256: str) -> str | None:
        """A presigned URL of the blob for an agent that asked to fetch it from the store itself, or None
        when the store has none (docs/design/artifacts.md §4 "Direct downloads")."""
        if not self.direct_downloads:
            return None
        url = await self.blob_store.signed_get_url(sha256, DIRECT_URL_TTL)
        if url is not None:
            self.metrics.downloads.labels("redirected").inc()
        return url

    async def test_reports(self, run_id: str) -> list[dict[str, Any]]:
        """The run's test summaries."""
        async with self.db.read() as conn:
            return await store.test_reports_of_run(conn, run_id)

    # -- retention ----------------------------------------------------------------------------------

    async def _in_batches(
        self,
        delete: Callable[[AsyncConnection], Awaitable[int]],
        fence: Callable[[Any], Awaitable[None]] | None,
    ) -> int:
        """Run `delete` (up to `BATCH` rows) in transactions of its own until it deletes fewer; the total."""
        total = 0
        while True:
            async with self.db.transaction() as conn:
                deleted = await delete(conn)
                if fence is not None:
                    await fence(conn)
            total += deleted
            if deleted < BATCH:
                return total
            await asyncio.sleep(0)

    async def sweep(
        self,
        fence: Callable[[Any], Awaitable[None]] | None = None,
        now: datetime | None = None,
    ) -> dict[str, int]:
        """Expired artifacts and stale uploads, then the blobs nothing references any more."""
        now = now or self.clock()
        totals = {"artifacts": 0, "artifact_uploads": 0, "cache_entries": 0}
        # Cache entries unused for `cache_ttl_days` (docs/design/caches.md §6), org by org.
        async with self.db.read() as conn:
            cache_orgs = await store.cache_orgs(conn)
        for org_id in cache_orgs:
            before = now - timedelta(days=await self.knob(org_id, "cache_ttl_days"))
            totals["cache_entries"] += await self._in_batches(
                functools.partial(store.expire_cache_entries, org_id=org_id, before=before, limit=BATCH),
                fence,
            )
        totals["artifacts"] = await self._in_batches(
            lambda conn: store.delete_expired(conn, now, BATCH), fence
        )
        totals["artifact_uploads"] = await self._in_batches(
            lambda conn: store.delete_stale_uploads(conn, now - self.grace, BATCH), fence
        )
        blobs = await BlobSweep(
            self.db,
            self.blob_store,
            references=store.blob_references(),
            grace=self.grace,
            on_deleted=lambda reason, count: self.metrics.blobs_deleted.labels(reason).inc(count),
        ).sweep(now, fence)
        async with self.db.read() as conn:
            self.metrics.stored_bytes.set(await store.stored_bytes(conn))
        return {**totals, **{f"blobs_{reason}": count for reason, count in blobs.items()}}


async def take_committed_upload(
    conn: AsyncConnection, scope: store.JobScope, body: dict[str, Any], what: str
) -> dict[str, Any]:
    """The job's upload `body["upload_id"]`, consumed by a commit of `what` (an artifact, a cache entry):
    404 when there is none, 400 when the client's digest or size differ from what was stored, 409
    `upload_expired` when the sweep took its bytes; else the blob's row stays locked live until the commit
    ends, so the sweep cannot take them under the new reference."""
    upload = await store.take_upload(conn, str(body["upload_id"]), scope.job_id)
    if upload is None:
        raise not_found(f"upload {body['upload_id']} of job {scope.job_id}")
    if upload["sha256"] != body["sha256"] or upload["size"] != body["size"]:
        raise ApiError(
            400,
            "digest_mismatch",
            f"the server stored {upload['size']} bytes with SHA-256 {upload['sha256']}; "
            f"the client sent {body['size']} bytes with {body['sha256']}",
        )
    if not await blob_rows.lock_live(conn, upload["sha256"]):
        raise conflict("upload_expired", f"the upload's bytes were swept; upload the {what} again")
    return upload


def retention_days(asked: int | None, knob: int) -> int | None:
    """Days an artifact is kept: what the step asked for, at most the knob (0 = kept with the run)."""
    if knob <= 0:
        return asked if asked and asked > 0 else None
    if asked is None or asked <= 0:
        return knob
    return min(asked, knob)


def too_large(limit: int, knob: str = "artifact_max_bytes") -> ApiError:
    """413 for an upload over `artifact_max_bytes` (or a cache entry's over `cache_max_entry_bytes`)."""
    what = "a cache entry" if knob.startswith("cache_") else "an artifact"
    return ApiError(413, "payload_too_large", f"{what} may hold at most {limit} bytes ({knob})")


async def _counted(chunks: AsyncIterable[bytes], metrics: ArtifactMetrics) -> AsyncIterator[bytes]:
    async for chunk in chunks:
        metrics.upload_bytes.inc(len(chunk))
        yield chunk
