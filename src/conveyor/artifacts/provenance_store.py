"""The SQL of provenance (docs/design/artifacts.md §9): signing keys' public halves, statements, and the
facts a statement is built from."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import delete, or_, select
from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.db.dialect import dialect_insert
from conveyor.db.tables import artifacts, jobs, provenance_keys, provenance_statements, runs


async def record_key(conn: AsyncConnection, key_id: str, public_key: str, now: datetime) -> None:
    """Record a signing key's public half (a key seen before is left as it is)."""
    await conn.execute(
        dialect_insert(conn, provenance_keys)
        .values(key_id=key_id, algorithm="ed25519", public_key=public_key, created_at=now)
        .on_conflict_do_nothing(index_elements=["key_id"])
    )


async def public_keys(conn: AsyncConnection) -> dict[str, str]:
    """Every recorded key: key id → base64 of its raw public key."""
    rows = await conn.execute(select(provenance_keys.c.key_id, provenance_keys.c.public_key))
    return {row.key_id: row.public_key for row in rows}


@dataclass(frozen=True)
class StoredStatement:
    """A minted statement: its envelope as signed, the key that signed it, when."""

    artifact_id: str
    key_id: str
    envelope: str
    created_at: datetime


async def statement_of(conn: AsyncConnection, artifact_id: str) -> StoredStatement | None:
    """The artifact's statement, if minted."""
    row = (
        await conn.execute(
            select(
                provenance_statements.c.artifact_id,
                provenance_statements.c.key_id,
                provenance_statements.c.envelope,
                provenance_statements.c.created_at,
            ).where(provenance_statements.c.artifact_id == artifact_id)
        )
    ).first()
    return None if row is None else StoredStatement(row.artifact_id, row.key_id, row.envelope, row.created_at)


async def insert_statement(
    conn: AsyncConnection, artifact_id: str, run_id: str, key_id: str, envelope: str, now: datetime
) -> None:
    """Store a statement unless the artifact has one already (a concurrent mint won: its row stays)."""
    await conn.execute(
        dialect_insert(conn, provenance_statements)
        .values(artifact_id=artifact_id, run_id=run_id, key_id=key_id, envelope=envelope, created_at=now)
        .on_conflict_do_nothing(index_elements=["artifact_id"])
    )


async def statement_facts(conn: AsyncConnection, artifact_id: str) -> dict[str, Any] | None:
    """The artifact's, its run's and its job's columns a statement is built from."""
    row = (
        await conn.execute(
            select(
                artifacts.c.name,
                artifacts.c.blob_sha256,
                artifacts.c.run_id,
                runs.c.routing_key,
                runs.c.repo,
                runs.c.ref,
                runs.c.sha,
                runs.c.event,
                runs.c.workflow,
                runs.c.lock_sha256,
                jobs.c.display_name,
                jobs.c.matrix,
                jobs.c.started_at,
                jobs.c.finished_at,
            )
            .select_from(artifacts)
            .join(runs, runs.c.id == artifacts.c.run_id)
            .join(jobs, jobs.c.id == artifacts.c.job_id, isouter=True)
            .where(artifacts.c.id == artifact_id)
        )
    ).first()
    return None if row is None else dict(row._mapping)


async def delete_expired_statements(
    conn: AsyncConnection, created_before: datetime | None, limit: int
) -> int:
    """Delete up to `limit` statements whose artifact is gone or was created before `created_before`."""
    artifact_gone = (
        ~select(artifacts.c.id).where(artifacts.c.id == provenance_statements.c.artifact_id).exists()
    )
    condition = artifact_gone
    if created_before is not None:
        old_artifact = (
            select(artifacts.c.id)
            .where(
                artifacts.c.id == provenance_statements.c.artifact_id, artifacts.c.created_at < created_before
            )
            .exists()
        )
        condition = or_(artifact_gone, old_artifact)
    ids = [
        row.artifact_id
        for row in await conn.execute(
            select(provenance_statements.c.artifact_id).where(condition).limit(limit)
        )
    ]
    if not ids:
        return 0
    result = await conn.execute(
        delete(provenance_statements).where(provenance_statements.c.artifact_id.in_(ids))
    )
    return int(result.rowcount or 0)
