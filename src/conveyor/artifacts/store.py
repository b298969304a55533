"""The SQL of artifacts, their uploads and test reports (docs/design/artifacts.md §3)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import delete, func, insert, select
from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.db.tables import artifact_uploads, artifacts, cache_entries, jobs, runs, test_reports

# A run holds at most this many artifacts (a list answers them all, without a cursor).
MAX_ARTIFACTS_PER_RUN = 1000


@dataclass(frozen=True)
class JobScope:
    """The job a credential belongs to, and what its artifacts are filed under."""

    job_id: str
    run_id: str
    org_id: str
    routing_key: str | None
    job_name: str
    matrix: dict[str, Any] | None


async def job_scope(conn: AsyncConnection, job_id: str) -> JobScope | None:
    """The job's run, org and routing key."""
    row = (
        await conn.execute(
            select(jobs.c.id, jobs.c.run_id, jobs.c.org_id, jobs.c.name, jobs.c.matrix, runs.c.routing_key)
            .join(runs, runs.c.id == jobs.c.run_id)
            .where(jobs.c.id == job_id)
        )
    ).first()
    if row is None:
        return None
    return JobScope(row.id, row.run_id, row.org_id, row.routing_key, row.name, row.matrix)


async def run_routing(conn: AsyncConnection, run_id: str) -> tuple[str, str | None] | None:
    """A run's org and routing key (None: no such run)."""
    row = (await conn.execute(select(runs.c.org_id, runs.c.routing_key).where(runs.c.id == run_id))).first()
    return None if row is None else (row.org_id, row.routing_key)


async def lock_run(conn: AsyncConnection, run_id: str) -> None:
    """Serialise commits of one run's artifacts (the run quota is checked under it)."""
    if conn.dialect.name == "postgresql":
        await conn.execute(select(runs.c.id).where(runs.c.id == run_id).with_for_update())


async def record_upload(conn: AsyncConnection, row: dict[str, Any]) -> None:
    """An upload stored and not yet committed."""
    await conn.execute(insert(artifact_uploads).values(**row))


async def take_upload(conn: AsyncConnection, upload_id: str, job_id: str) -> dict[str, Any] | None:
    """The job's upload, deleted (a commit consumes it)."""
    row = (
        await conn.execute(
            select(artifact_uploads).where(
                artifact_uploads.c.id == upload_id, artifact_uploads.c.job_id == job_id
            )
        )
    ).first()
    if row is None:
        return None
    await conn.execute(delete(artifact_uploads).where(artifact_uploads.c.id == upload_id))
    return dict(row._mapping)


async def run_usage(conn: AsyncConnection, run_id: str) -> tuple[int, int]:
    """(artifacts, bytes) the run holds."""
    row = (
        await conn.execute(
            select(func.count(), func.coalesce(func.sum(artifacts.c.size), 0)).where(
                artifacts.c.run_id == run_id
            )
        )
    ).one()
    return int(row[0]), int(row[1])


async def name_taken(conn: AsyncConnection, run_id: str, name: str) -> bool:
    """Whether the run already has an artifact of this name."""
    found = await conn.execute(
        select(artifacts.c.id).where(artifacts.c.run_id == run_id, artifacts.c.name == name)
    )
    return found.first() is not None


async def insert_artifact(conn: AsyncConnection, row: dict[str, Any]) -> None:
    """Make an artifact visible."""
    await conn.execute(insert(artifacts).values(**row))


def _listing(run_id: str) -> Any:
    return (
        select(artifacts, jobs.c.display_name.label("job_name"))
        .join(jobs, jobs.c.id == artifacts.c.job_id, isouter=True)
        .where(artifacts.c.run_id == run_id)
    )


async def artifacts_of_run(conn: AsyncConnection, run_id: str) -> list[dict[str, Any]]:
    """The run's artifacts, oldest first."""
    rows = await conn.execute(_listing(run_id).order_by(artifacts.c.created_at, artifacts.c.id))
    return [dict(row._mapping) for row in rows]


async def artifact_named(conn: AsyncConnection, run_id: str, name: str) -> dict[str, Any] | None:
    """One artifact of the run."""
    row = (await conn.execute(_listing(run_id).where(artifacts.c.name == name))).first()
    return None if row is None else dict(row._mapping)


async def insert_test_report(conn: AsyncConnection, row: dict[str, Any]) -> None:
    """A job's JUnit summary."""
    await conn.execute(insert(test_reports).values(**row))


async def test_reports_of_run(conn: AsyncConnection, run_id: str) -> list[dict[str, Any]]:
    """The run's test summaries, oldest first, with the job's display name."""
    rows = await conn.execute(
        select(test_reports, jobs.c.display_name.label("job_name"))
        .join(jobs, jobs.c.id == test_reports.c.job_id, isouter=True)
        .where(test_reports.c.run_id == run_id)
        .order_by(test_reports.c.created_at, test_reports.c.id)
    )
    return [dict(row._mapping) for row in rows]


async def test_reports_of_job(conn: AsyncConnection, run_id: str, job_id: str) -> list[dict[str, Any]]:
    """One job's test summaries, oldest first (found through the run's index)."""
    rows = await conn.execute(
        select(test_reports)
        .where(test_reports.c.run_id == run_id, test_reports.c.job_id == job_id)
        .order_by(test_reports.c.created_at, test_reports.c.id)
    )
    return [dict(row._mapping) for row in rows]


async def delete_expired(conn: AsyncConnection, now: datetime, limit: int) -> int:
    """Delete up to `limit` artifacts past `expires_at` or whose run is gone, with their test reports."""
    gone_run = ~select(runs.c.id).where(runs.c.id == artifacts.c.run_id).exists()
    ids = [
        row.id
        for row in await conn.execute(
            select(artifacts.c.id)
            .where((artifacts.c.expires_at.is_not(None) & (artifacts.c.expires_at < now)) | gone_run)
            .limit(limit)
        )
    ]
    if not ids:
        return 0
    await conn.execute(delete(test_reports).where(test_reports.c.artifact_id.in_(ids)))
    result = await conn.execute(delete(artifacts).where(artifacts.c.id.in_(ids)))
    return int(result.rowcount or 0)


async def delete_stale_uploads(conn: AsyncConnection, before: datetime, limit: int) -> int:
    """Uploads never committed, stored before `before`."""
    ids = [
        row.id
        for row in await conn.execute(
            select(artifact_uploads.c.id).where(artifact_uploads.c.created_at < before).limit(limit)
        )
    ]
    if not ids:
        return 0
    result = await conn.execute(delete(artifact_uploads).where(artifact_uploads.c.id.in_(ids)))
    return int(result.rowcount or 0)


async def stored_bytes(conn: AsyncConnection) -> int:
    """Bytes of every live artifact (the `conveyor_artifact_bytes` gauge)."""
    return int((await conn.execute(select(func.coalesce(func.sum(artifacts.c.size), 0)))).scalar_one())


async def cache_orgs(conn: AsyncConnection) -> list[str]:
    """The orgs holding cache entries (the TTL is an org's knob)."""
    return [row[0] for row in await conn.execute(select(cache_entries.c.org_id).distinct())]


async def expire_cache_entries(conn: AsyncConnection, org_id: str, before: datetime, limit: int) -> int:
    """Delete up to `limit` of the org's cache entries last used before `before`."""
    ids = [
        row.id
        for row in await conn.execute(
            select(cache_entries.c.id)
            .where(cache_entries.c.org_id == org_id, cache_entries.c.last_used_at < before)
            .limit(limit)
        )
    ]
    if not ids:
        return 0
    await conn.execute(delete(cache_entries).where(cache_entries.c.id.in_(ids)))
    return len(ids)


def blob_references() -> Sequence[Any]:
    """The columns that keep a blob alive (the blob sweep's references)."""
    return [artifacts.c.blob_sha256, artifact_uploads.c.sha256, cache_entries.c.blob_sha256]
