"""All SQL of the scaler: spawn records, their history, and what the scaler reads of the queue
(docs/design/scaler.md §8), and the shared configuration's row (docs/design/scaler.md §11)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import delete, insert, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.db.dialect import dialect_insert
from conveyor.db.tables import (
    agents,
    cluster_instances,
    dispatch_queue,
    jobs,
    scaler_config,
    scaler_spawn_history,
    scaler_spawns,
)
from conveyor.runtime import store as runtime_store
from conveyor.scaler.config import SharedConfig

HISTORY_COLUMNS = tuple(
    c.name for c in scaler_spawn_history.c if c.name not in ("ended_at", "outcome", "error", "log_tail")
)


@dataclass(frozen=True)
class PendingJob:
    """A queued row the scaler may spawn for."""

    job_id: str
    run_id: str
    org_id: str
    runs_on: dict[str, Any]
    enqueued_at: datetime
    bound_agent_id: str | None
    note: str | None


async def insert_spawn(conn: AsyncConnection, **values: Any) -> None:
    """Record a spawn (state `spawning`)."""
    await conn.execute(insert(scaler_spawns).values(**values))


async def get_spawn(conn: AsyncConnection, agent_id: str) -> dict[str, Any] | None:
    row = (await conn.execute(select(scaler_spawns).where(scaler_spawns.c.agent_id == agent_id))).first()
    return dict(row._mapping) if row is not None else None


async def set_backend_ref(conn: AsyncConnection, agent_id: str, ref: str) -> None:
    await conn.execute(
        update(scaler_spawns).where(scaler_spawns.c.agent_id == agent_id).values(backend_ref=ref)
    )


async def mark_registered(conn: AsyncConnection, agent_id: str, now: datetime) -> bool:
    """`spawning` → `registered`; False when there is no such spawn."""
    result = await conn.execute(
        update(scaler_spawns)
        .where(scaler_spawns.c.agent_id == agent_id)
        .values(state="registered", registered_at=now)
    )
    return result.rowcount == 1


async def end_spawn(
    conn: AsyncConnection,
    agent_id: str,
    *,
    outcome: str,
    now: datetime,
    error: str | None = None,
    log_tail: list[str] | None = None,
) -> dict[str, Any] | None:
    """Move the spawn row to the history in this transaction; the row as it was, or None."""
    row = await get_spawn(conn, agent_id)
    if row is None:
        return None
    await conn.execute(delete(scaler_spawns).where(scaler_spawns.c.agent_id == agent_id))
    await conn.execute(
        insert(scaler_spawn_history).values(
            **{name: row[name] for name in HISTORY_COLUMNS},
            ended_at=now,
            outcome=outcome,
            error=error[:4000] if error else None,
            log_tail=log_tail or None,
        )
    )
    return row


async def spawns_of_node(conn: AsyncConnection, node_id: str) -> list[dict[str, Any]]:
    rows = await conn.execute(select(scaler_spawns).where(scaler_spawns.c.node_id == node_id))
    return [dict(row._mapping) for row in rows]


async def all_spawns(conn: AsyncConnection) -> list[dict[str, Any]]:
    return [dict(row._mapping) for row in await conn.execute(select(scaler_spawns))]


async def adoption_states(conn: AsyncConnection) -> list[tuple[str, str, str | None, datetime | None]]:
    """(agent id, node id, adopted by, adopted at) of every spawn row, for the backstop."""
    rows = await conn.execute(
        select(
            scaler_spawns.c.agent_id,
            scaler_spawns.c.node_id,
            scaler_spawns.c.adopted_by,
            scaler_spawns.c.adopted_at,
        )
    )
    return [(agent_id, node_id, by, at) for agent_id, node_id, by, at in rows]


async def set_adoption(
    conn: AsyncConnection, agent_ids: Sequence[str], adopted_by: str | None, adopted_at: datetime | None
) -> None:
    """Adopt the rows (or give them back with None); only the fenced leader writes this."""
    if agent_ids:
        await conn.execute(
            update(scaler_spawns)
            .where(scaler_spawns.c.agent_id.in_(list(agent_ids)))
            .values(adopted_by=adopted_by, adopted_at=adopted_at)
        )


async def has_adopted(conn: AsyncConnection, instance_id: str) -> bool:
    """Whether `instance_id` adopted any spawn row."""
    found = await conn.execute(
        select(scaler_spawns.c.agent_id).where(scaler_spawns.c.adopted_by == instance_id).limit(1)
    )
    return found.first() is not None


async def pending_jobs(conn: AsyncConnection, now: datetime, limit: int) -> list[PendingJob]:
    """Pending queue rows, oldest first."""
    rows = await conn.execute(
        select(
            dispatch_queue.c.job_id,
            dispatch_queue.c.run_id,
            dispatch_queue.c.org_id,
            dispatch_queue.c.runs_on,
            dispatch_queue.c.enqueued_at,
            dispatch_queue.c.bound_agent_id,
            dispatch_queue.c.unschedulable,
        )
        .where(dispatch_queue.c.state == "pending", dispatch_queue.c.not_before <= now)
        .order_by(dispatch_queue.c.enqueued_at)
        .limit(limit)
    )
    return [PendingJob(*row) for row in rows]


async def claim_binding(conn: AsyncConnection, job_id: str, agent_id: str, expected: str | None) -> bool:
    """Bind a pending row to a new spawn if its binding is still `expected` (compare-and-swap).

    Coordinators sharing the queue race here; exactly one binds a row, so a job gets one spawn.
    """
    current = dispatch_queue.c.bound_agent_id
    result = await conn.execute(
        update(dispatch_queue)
        .where(
            dispatch_queue.c.job_id == job_id,
            dispatch_queue.c.state == "pending",
            current.is_(None) if expected is None else current == expected,
        )
        .values(bound_agent_id=agent_id)
    )
    return result.rowcount == 1


async def release_binding(conn: AsyncConnection, job_id: str, agent_id: str) -> None:
    """Clear a row's binding to `agent_id` (another spawn's binding is left alone)."""
    await conn.execute(
        update(dispatch_queue)
        .where(dispatch_queue.c.job_id == job_id, dispatch_queue.c.bound_agent_id == agent_id)
        .values(bound_agent_id=None)
    )


async def clear_binding(conn: AsyncConnection, job_id: str) -> None:
    await conn.execute(
        update(dispatch_queue).where(dispatch_queue.c.job_id == job_id).values(bound_agent_id=None)
    )


async def spawn_exists(conn: AsyncConnection, agent_id: str) -> bool:
    found = await conn.execute(select(scaler_spawns.c.agent_id).where(scaler_spawns.c.agent_id == agent_id))
    return found.first() is not None


async def set_provisioning_error(conn: AsyncConnection, job_id: str, error: str | None) -> None:
    await conn.execute(
        update(dispatch_queue)
        .where(dispatch_queue.c.job_id == job_id)
        .values(last_provisioning_error=error[:2000] if error else None)
    )


async def set_wait_note(conn: AsyncConnection, job_id: str, note: str) -> None:
    """The pending row's note and the queued job's reason (never over an `unschedulable` clock)."""
    await conn.execute(
        update(dispatch_queue)
        .where(dispatch_queue.c.job_id == job_id, dispatch_queue.c.state == "pending")
        .values(unschedulable=note, unschedulable_since=None)
    )
    await conn.execute(update(jobs).where(jobs.c.id == job_id, jobs.c.status == "queued").values(reason=note))


async def job_is_pending(conn: AsyncConnection, job_id: str) -> bool:
    row = (
        await conn.execute(select(dispatch_queue.c.state).where(dispatch_queue.c.job_id == job_id))
    ).first()
    return row is not None and row.state == "pending"


async def queue_bindings(conn: AsyncConnection) -> dict[str, str]:
    """agent id → job id of every non-terminal queue row bound to or claimed by an agent."""
    rows = await conn.execute(
        select(dispatch_queue.c.job_id, dispatch_queue.c.agent_id, dispatch_queue.c.bound_agent_id)
    )
    bindings: dict[str, str] = {}
    for job_id, agent_id, bound in rows:
        for value in (agent_id, bound):
            if value:
                bindings[value] = job_id
    held = await conn.execute(
        select(jobs.c.id, jobs.c.agent_id).where(
            jobs.c.agent_id.is_not(None),
            jobs.c.status.in_(["dispatched", "running", "recovering", "cancelling"]),
        )
    )
    for job_id, agent_id in held:
        bindings.setdefault(agent_id, job_id)
    return bindings


async def online_agents(conn: AsyncConnection) -> dict[str, str | None]:
    """agent id → the coordinator it is connected to, for every online/draining agent."""
    rows = await conn.execute(
        select(agents.c.agent_id, agents.c.instance_id).where(agents.c.state.in_(["online", "draining"]))
    )
    return {agent_id: instance for agent_id, instance in rows}


async def coordinators(conn: AsyncConnection) -> list[tuple[str, datetime]]:
    """(instance id, last heartbeat) of every coordinator the cluster knows."""
    rows = await conn.execute(
        select(cluster_instances.c.instance_id, cluster_instances.c.last_heartbeat_at).where(
            cluster_instances.c.role == "coordinator"
        )
    )
    return [(instance_id, at) for instance_id, at in rows]


# --- the shared configuration (docs/design/scaler.md §11)

SHARED_CONFIG_ID = "default"


@dataclass(frozen=True)
class SharedConfigRow:
    """The stored shared `scalers.yaml`."""

    version: int
    content: str
    sha256: str
    updated_at: datetime
    updated_by: str | None

    def shared(self) -> SharedConfig:
        """What a node holds of it."""
        return SharedConfig(self.version, self.content, self.sha256)


def _shared_config_row(row: Any) -> SharedConfigRow:
    return SharedConfigRow(
        version=int(row.version),
        content=row.content,
        sha256=row.sha256,
        updated_at=row.updated_at,
        updated_by=row.updated_by,
    )


async def read_shared_config(conn: AsyncConnection) -> SharedConfigRow | None:
    """The shared configuration, or None when none was ever set."""
    row = (await conn.execute(select(scaler_config).where(scaler_config.c.id == SHARED_CONFIG_ID))).first()
    return _shared_config_row(row) if row is not None else None


async def store_shared_config(
    conn: AsyncConnection, *, content: str, sha256: str, by: str
) -> tuple[SharedConfigRow, int, bool]:
    """Store `content` unless it is what is stored; (row, cluster_settings version, changed).

    The `cluster_settings` row is locked first (created if needed), so concurrent sets serialise on it,
    and its `version` is bumped with the configuration's own: the version workers pull on covers it.
    """
    settings = await runtime_store.lock_cluster_settings(conn)
    current = await read_shared_config(conn)
    if current is not None and current.sha256 == sha256:
        return current, settings.version, False
    at = await runtime_store.database_now(conn)
    values = {
        "version": (current.version if current else 0) + 1,
        "content": content,
        "sha256": sha256,
        "updated_at": at,
        "updated_by": by,
    }
    statement = (
        dialect_insert(conn, scaler_config)
        .values(id=SHARED_CONFIG_ID, **values)
        .on_conflict_do_update(index_elements=["id"], set_=values)
        .returning(*scaler_config.c)
    )
    row = _shared_config_row((await conn.execute(statement)).one())
    await runtime_store.write_cluster_settings(
        conn, settings.values, version=settings.version + 1, at=at, by=by
    )
    return row, settings.version + 1, True
