"""Where a scaler manager keeps its spawn records and finds the jobs it spawns for.

A coordinator's records are the shared rows (`DatabaseSpawnRecords`: `scaler_spawns`, the queue's
bindings, agent tokens). A worker has no database: its records are in memory and its pending jobs
are the rerouted jobs it holds (`conveyor.cluster.worker`).
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.agents import store as agent_store
from conveyor.db.engine import Database
from conveyor.errors import ConveyorError
from conveyor.execution.history import timeline
from conveyor.model.ids import utc_now
from conveyor.scaler import claims, store
from conveyor.scaler.backend import ScalerEntry, ScalerEvent
from conveyor.scaler.store import PendingJob

if TYPE_CHECKING:
    from conveyor.scaler.manager import Spawn


class _BindingTaken(ConveyorError):
    """Another spawn bound the job first."""


class SpawnRecords(Protocol):
    """What a scaler manager records, and where its work comes from."""

    async def pending_jobs(self, limit: int) -> list[PendingJob]:
        """Jobs waiting for an agent, oldest first."""
        ...

    async def spawn_exists(self, agent_id: str) -> bool:
        """Whether some node recorded a spawn with this agent id."""
        ...

    async def set_wait_note(self, job_id: str, note: str) -> None:
        """Why a job waits (shown on the job)."""
        ...

    async def reserve(
        self,
        spawn: Spawn,
        job: PendingJob | None,
        *,
        entry: ScalerEntry,
        node_id: str,
        boot_id: str,
        token_expires_at: datetime,
        deadline_at: datetime,
    ) -> tuple[str, str] | None:
        """Bind the job to the spawn, mint its single-use agent token and record the spawn.

        Returns `(token, token_id)`, or None when another spawn already serves the job.
        """
        ...

    async def set_backend_ref(self, agent_id: str, ref: str) -> None:
        """The backend's handle on the spawned compute."""
        ...

    async def spawn_failed(
        self, spawn: Spawn, *, outcome: str, message: str, log_tail: list[str], note: str
    ) -> None:
        """A provisioning failure: close the record, revoke the token, free and annotate the job."""
        ...

    async def spawn_ended(self, spawn: Spawn, *, outcome: str, error: str | None) -> None:
        """A spawned agent's life ended: close the record, revoke the token, free the job."""
        ...

    async def registered(self, spawn: Spawn) -> bool:
        """The spawned agent registered; whether its bound job still waits for it."""
        ...

    async def reap(self, node_id: str, boot_id: str, live: set[str], claim_retention_ms: int) -> int:
        """Close records of this boot with no spawn in memory; how many."""
        ...

    async def end_leftovers(self, node_id: str, boot_id: str) -> None:
        """At boot: close the records an older boot of this node left."""
        ...


class DatabaseSpawnRecords:
    """A coordinator's spawn records: the shared rows."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def pending_jobs(self, limit: int) -> list[PendingJob]:
        """Pending `dispatch_queue` rows."""
        async with self.db.read() as conn:
            return await store.pending_jobs(conn, utc_now(), limit)

    async def spawn_exists(self, agent_id: str) -> bool:
        """A `scaler_spawns` row of any coordinator."""
        async with self.db.read() as conn:
            return await store.spawn_exists(conn, agent_id)

    async def set_wait_note(self, job_id: str, note: str) -> None:
        """The queue row's and job's note."""
        async with self.db.transaction() as conn:
            await store.set_wait_note(conn, job_id, note)

    async def reserve(
        self,
        spawn: Spawn,
        job: PendingJob | None,
        *,
        entry: ScalerEntry,
        node_id: str,
        boot_id: str,
        token_expires_at: datetime,
        deadline_at: datetime,
    ) -> tuple[str, str] | None:
        """One transaction: the queue binding, the token and the spawn row."""
        try:
            return await self._reserve(spawn, job, entry, node_id, boot_id, token_expires_at, deadline_at)
        except _BindingTaken:
            return None

    async def _reserve(
        self,
        spawn: Spawn,
        job: PendingJob | None,
        entry: ScalerEntry,
        node_id: str,
        boot_id: str,
        token_expires_at: datetime,
        deadline_at: datetime,
    ) -> tuple[str, str]:
        label_set = spawn.label_set
        async with self.db.transaction() as conn:
            if job is not None and not await store.claim_binding(
                conn, job.job_id, spawn.agent_id, job.bound_agent_id
            ):
                raise _BindingTaken  # rolls the transaction back
            token, row = await agent_store.mint_agent_token(
                conn,
                labels=list(label_set.labels),
                mandatory_labels=list(entry.mandatory_labels),
                label=f"scaler {entry.name}",
                created_by=f"scaler:{entry.name}"[:64],
                kind="ephemeral",
                single_use=True,
                expires_at=token_expires_at,
                agent_id=spawn.agent_id,
            )
            await store.insert_spawn(
                conn,
                agent_id=spawn.agent_id,
                node_id=node_id,
                boot_id=boot_id,
                scaler=entry.name,
                backend_type=entry.type,
                label_set=list(label_set.all_labels),
                bound_job_id=spawn.bound_job_id,
                run_id=spawn.run_id,
                org_id=spawn.org_id,
                warm=spawn.warm,
                state="spawning",
                cpus=spawn.cpus,
                mem_bytes=spawn.mem_bytes,
                token_id=row.id,
                spawned_at=utc_now(),
                deadline_at=deadline_at,
            )
        return token, row.id

    async def set_backend_ref(self, agent_id: str, ref: str) -> None:
        """`scaler_spawns.backend_ref`."""
        async with self.db.transaction() as conn:
            await store.set_backend_ref(conn, agent_id, ref)

    async def spawn_failed(
        self, spawn: Spawn, *, outcome: str, message: str, log_tail: list[str], note: str
    ) -> None:
        """History row, token revoked, binding released, the error on the job and its timeline."""
        async with self.db.transaction() as conn:
            await store.end_spawn(
                conn, spawn.agent_id, outcome=outcome, now=utc_now(), error=message, log_tail=log_tail[-200:]
            )
            if spawn.token_id:
                await agent_store.revoke_agent_token(conn, spawn.token_id, utc_now())
            if spawn.bound_job_id is not None:
                await store.release_binding(conn, spawn.bound_job_id, spawn.agent_id)
                await store.set_provisioning_error(conn, spawn.bound_job_id, message)
                if await store.job_is_pending(conn, spawn.bound_job_id):
                    await store.set_wait_note(conn, spawn.bound_job_id, note)
                if spawn.run_id:
                    await timeline(
                        conn,
                        spawn.run_id,
                        spawn.bound_job_id,
                        "scaler",
                        "scaler.failed",
                        {
                            "agent_id": spawn.agent_id,
                            "scaler": spawn.scaler,
                            "error": message,
                            "log_tail": log_tail[-20:],
                        },
                    )

    async def spawn_ended(self, spawn: Spawn, *, outcome: str, error: str | None) -> None:
        """History row, token revoked, binding released."""
        async with self.db.transaction() as conn:
            await store.end_spawn(conn, spawn.agent_id, outcome=outcome, now=utc_now(), error=error)
            if spawn.token_id:
                await agent_store.revoke_agent_token(conn, spawn.token_id, utc_now())
            if spawn.bound_job_id is not None:
                await store.release_binding(conn, spawn.bound_job_id, spawn.agent_id)

    async def registered(self, spawn: Spawn) -> bool:
        """Spawn row registered, provisioning error cleared, buffered progress onto the run timeline."""
        agent_id = spawn.agent_id
        async with self.db.transaction() as conn:
            await store.mark_registered(conn, agent_id, utc_now())
            pending = spawn.bound_job_id is not None and await store.job_is_pending(conn, spawn.bound_job_id)
            if spawn.bound_job_id is not None and pending:
                await store.set_provisioning_error(conn, spawn.bound_job_id, None)
            if spawn.run_id is not None:
                # The spawn's buffered progress joins the run timeline once it is linked to the job.
                for event in [*spawn.events, ScalerEvent(agent_id, "ready", "agent registered")]:
                    await timeline(
                        conn,
                        spawn.run_id,
                        spawn.bound_job_id,
                        "scaler",
                        f"scaler.{event.kind}",
                        {"agent_id": agent_id, "scaler": spawn.scaler, "detail": event.detail},
                    )
                spawn.events.clear()
        return pending

    async def reap(self, node_id: str, boot_id: str, live: set[str], claim_retention_ms: int) -> int:
        """Rows of this node and boot with no spawn in memory move to the history (`lost`)."""
        ended = 0
        async with self.db.transaction() as conn:
            for row in await store.spawns_of_node(conn, node_id):
                if row["boot_id"] == boot_id and row["agent_id"] not in live:
                    await store.end_spawn(
                        conn, row["agent_id"], outcome="failed", now=utc_now(), error="lost"
                    )
                    ended += 1
            # Event-backend claims consumed or expired longer ago than the retention.
            await claims.delete_old_claims(conn, claims.purge_before(utc_now(), claim_retention_ms))
        return ended

    async def end_leftovers(self, node_id: str, boot_id: str) -> None:
        """Rows of an older boot of this node: ended `node_restarted`, tokens revoked, bindings freed."""
        async with self.db.transaction() as conn:
            for row in await store.spawns_of_node(conn, node_id):
                if row["boot_id"] != boot_id:
                    await close_spawn_row(conn, row, outcome="node_restarted", now=utc_now())


async def close_spawn_row(
    conn: AsyncConnection, row: dict[str, Any], *, outcome: str, now: datetime, error: str | None = None
) -> None:
    """A spawn row no live spawn holds: to the history, its token revoked, its job's binding freed."""
    await store.end_spawn(conn, row["agent_id"], outcome=outcome, now=now, error=error)
    if row["token_id"]:
        await agent_store.revoke_agent_token(conn, row["token_id"], now)
    if row["bound_job_id"]:
        await store.release_binding(conn, row["bound_job_id"], row["agent_id"])
