"""Dependency caches on the server (docs/design/caches.md §3–§4): a job's lookup, the content of an entry
it may read, and the commit of an uploaded entry where the first complete save of a key wins.

The repository and scopes come from the job's run, never from the client; the choice itself is the pure
`model.caches.choose_entry`. Bytes travel as artifact uploads (docs/design/artifacts.md §4) and live on the same
blob store, referenced by `cache_entries.blob_sha256` in the blob sweep."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, or_, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.artifacts import store
from conveyor.artifacts.service import ArtifactService, take_committed_upload, too_large
from conveyor.db.dialect import dialect_insert
from conveyor.db.tables import cache_entries, runs, sources, step_caches
from conveyor.model.caches import Candidate, choose_entry, key_problem, readable_scopes, scope_of
from conveyor.model.errors import ApiError, not_found
from conveyor.model.ids import new_id


@dataclass(frozen=True)
class CacheScope:
    """Where a job's cache entries are filed and what it may read."""

    org_id: str
    source: str
    repo: str
    writes: str
    reads: tuple[str, ...]


async def cache_scope(conn: AsyncConnection, job: store.JobScope) -> CacheScope:
    """The repository and scopes of the job's run (docs/design/caches.md §2)."""
    row = (
        await conn.execute(select(runs.c.repo, runs.c.event, runs.c.source_id).where(runs.c.id == job.run_id))
    ).one()
    event: dict[str, Any] = dict(row.event or {})
    return CacheScope(
        org_id=job.org_id,
        # The source row, not its kind: two sources of one kind naming the same repo keep apart.
        source=str(row.source_id or event.get("source") or ""),
        repo=row.repo,
        writes=scope_of(event),
        reads=readable_scopes(event),
    )


def _of_repository(scope: CacheScope) -> Any:
    return (
        (cache_entries.c.org_id == scope.org_id)
        & (cache_entries.c.source == scope.source)
        & (cache_entries.c.repo == scope.repo)
        & cache_entries.c.scope.in_(scope.reads)
    )


def _checked_key(value: object, what: str) -> str:
    problem = key_problem(value, what)
    if problem is not None:
        raise ApiError(422, "invalid_body", problem)
    return str(value)


async def record_step(
    conn: AsyncConnection, job_id: str, step_index: int | None, key: str, values: dict[str, Any]
) -> None:
    """Note what a step's cache did (docs/design/caches.md §7): the lookup's answer or the save's outcome,
    whichever comes first creating the row. Nothing without a step (an agent that does not say it)."""
    if step_index is None:
        return
    statement = dialect_insert(conn, step_caches).values(
        job_id=job_id, step_index=step_index, key=key, **values
    )
    await conn.execute(
        statement.on_conflict_do_update(index_elements=["job_id", "step_index", "key"], set_=values)
    )


async def lookup(
    service: ArtifactService, job: store.JobScope, body: dict[str, Any], step_index: int | None = None
) -> dict[str, Any]:
    """The entry a restore takes (`{kind, entry}`); a hit marks the entry used."""
    key = _checked_key(body.get("key"), "cache key")
    prefixes = [_checked_key(p, "restore key") for p in body.get("restore_keys") or []]
    async with service.db.transaction() as conn:
        scope = await cache_scope(conn, job)
        wanted = [cache_entries.c.key == key] + [
            cache_entries.c.key.startswith(prefix, autoescape=True) for prefix in prefixes
        ]
        rows = {
            row.id: row
            for row in await conn.execute(select(cache_entries).where(_of_repository(scope), or_(*wanted)))
        }
        choice = choose_entry(
            (Candidate(r.id, r.scope, r.key, r.created_at) for r in rows.values()),
            key,
            prefixes,
            scope.reads,
        )
        service.metrics.cache_lookups.labels(choice.kind).inc()
        chosen = None if choice.entry is None else rows[choice.entry.id]
        # A second lookup of the key in the step (a retried step) starts its record again.
        await record_step(
            conn,
            job.job_id,
            step_index,
            key,
            {
                "kind": choice.kind,
                "restored_key": None if chosen is None else chosen.key,
                "saved": None,
                "saved_size": None,
                "updated_at": service.clock(),
            },
        )
        if chosen is None:
            return {"kind": "miss", "entry": None}
        await conn.execute(
            update(cache_entries).where(cache_entries.c.id == chosen.id).values(last_used_at=service.clock())
        )
    return {
        "kind": choice.kind,
        "entry": {
            "key": chosen.key,
            "scope": chosen.scope,
            "sha256": chosen.blob_sha256,
            "size": chosen.size,
        },
    }


async def content(service: ArtifactService, job: store.JobScope, sha256: str) -> AsyncIterator[bytes]:
    """An entry's bytes, when the job may read an entry holding them; else 404 before any byte."""
    async with service.db.read() as conn:
        scope = await cache_scope(conn, job)
        found = (
            await conn.execute(
                select(cache_entries.c.id).where(_of_repository(scope), cache_entries.c.blob_sha256 == sha256)
            )
        ).first()
    if found is None:
        raise not_found(f"cache content {sha256}")
    return _counted(service, service.blob_store.get(sha256))


async def _counted(service: ArtifactService, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    async for chunk in chunks:
        service.metrics.cache_restored_bytes.inc(len(chunk))
        yield chunk


async def commit(
    service: ArtifactService, job: store.JobScope, body: dict[str, Any], step_index: int | None = None
) -> dict[str, Any]:
    """File an upload as the entry `key` of the run's scope; `{saved: false}` when the key is taken."""
    key = _checked_key(body.get("key"), "cache key")
    now = service.clock()
    entry_max = await service.knob(job.org_id, "cache_max_entry_bytes")
    total_max = await service.knob(job.org_id, "cache_max_total_bytes")
    if int(body["size"]) > entry_max:
        raise too_large(entry_max, "cache_max_entry_bytes")
    async with service.db.transaction() as conn:
        scope = await cache_scope(conn, job)
        upload = await take_committed_upload(conn, job, body, "entry")
        row = {
            "id": new_id(),
            "org_id": scope.org_id,
            "source": scope.source,
            "repo": scope.repo,
            "scope": scope.writes,
            "key": key,
            "blob_sha256": upload["sha256"],
            "size": upload["size"],
            "created_at": now,
            "last_used_at": now,
            "created_by_job_id": job.job_id,
        }
        # The first complete save wins: a concurrent second one inserts nothing, and its blob is left to
        # the sweep (docs/design/caches.md §3).
        # RETURNING rather than rowcount: a driver may report -1 (unknown) for an insert that did nothing.
        inserted = (
            await conn.execute(
                dialect_insert(conn, cache_entries)
                .values(**row)
                .on_conflict_do_nothing(index_elements=["org_id", "source", "repo", "scope", "key"])
                .returning(cache_entries.c.id)
            )
        ).first()
        await record_step(
            conn,
            job.job_id,
            step_index,
            key,
            {
                "saved": "dropped" if inserted is None else "saved",
                "saved_size": None if inserted is None else row["size"],
                "updated_at": now,
            },
        )
    if inserted is None:
        service.metrics.cache_saves.labels("dropped").inc()
        return {"saved": False, "reason": "the key exists"}
    service.metrics.cache_saves.labels("saved").inc()
    service.metrics.cache_saved_bytes.inc(row["size"])
    async with service.db.transaction() as conn:
        evicted = await evict_least_recently_used(conn, scope, total_max)
    return {"saved": True, "size": row["size"], "scope": row["scope"], "evicted": evicted}


async def evict_least_recently_used(conn: AsyncConnection, scope: CacheScope, total_max: int) -> int:
    """Delete the repository's least recently used entries (every scope) until its entries hold at most
    `total_max` bytes; how many went. The newest save is the most recently used, so it goes last."""
    rows = await conn.execute(
        select(cache_entries.c.id, cache_entries.c.size)
        .where(
            cache_entries.c.org_id == scope.org_id,
            cache_entries.c.source == scope.source,
            cache_entries.c.repo == scope.repo,
        )
        .order_by(cache_entries.c.last_used_at.desc(), cache_entries.c.id.desc())
    )
    kept, doomed = 0, list[str]()
    for row in rows:
        if kept + row.size <= total_max and not doomed:
            kept += row.size
        else:
            doomed.append(row.id)
    if doomed:
        await conn.execute(delete(cache_entries).where(cache_entries.c.id.in_(doomed)))
    return len(doomed)


# -- admin (docs/design/caches.md §7) ------------------------------------------------------------------

ADMIN_LIST_LIMIT = 1000


async def admin_list(
    conn: AsyncConnection, org_id: str, source: str | None, key_prefix: str | None
) -> list[dict[str, Any]]:
    """The org's entries, most recently used first (at most `ADMIN_LIST_LIMIT`); `source` is a source's id
    or name."""
    query = select(cache_entries).where(cache_entries.c.org_id == org_id)
    if source:
        named = (
            await conn.execute(
                select(sources.c.id).where(sources.c.org_id == org_id, sources.c.name == source)
            )
        ).first()
        query = query.where(cache_entries.c.source == (named.id if named else source))
    if key_prefix:
        query = query.where(cache_entries.c.key.startswith(key_prefix, autoescape=True))
    rows = await conn.execute(
        query.order_by(cache_entries.c.last_used_at.desc(), cache_entries.c.id.desc()).limit(ADMIN_LIST_LIMIT)
    )
    return [dict(row._mapping) for row in rows]


async def admin_delete(conn: AsyncConnection, org_id: str, entry_id: str) -> dict[str, Any] | None:
    """Delete one entry (its blob goes with the next sweep); None when there is none."""
    row = (
        await conn.execute(
            select(cache_entries).where(cache_entries.c.id == entry_id, cache_entries.c.org_id == org_id)
        )
    ).first()
    if row is None:
        return None
    await conn.execute(delete(cache_entries).where(cache_entries.c.id == entry_id))
    return dict(row._mapping)
