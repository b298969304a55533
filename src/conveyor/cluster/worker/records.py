"""The scaler manager's spawn records on a worker: its pending jobs are the held jobs no agent has taken;
a spawn failure is relayed to the job's coordinator (docs/design/cluster.md §4.3)."""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime
from typing import TYPE_CHECKING, Any

from conveyor.cluster.messages import ScalerEventRelay
from conveyor.model.ids import format_rfc3339, utc_now
from conveyor.scaler.backend import ScalerEntry
from conveyor.scaler.store import PendingJob

if TYPE_CHECKING:
    from conveyor.cluster.worker.service import WorkerService

log = logging.getLogger(__name__)


class WorkerRecords:
    """The scaler manager's records on a worker: pending jobs are held jobs no agent has taken."""

    def __init__(self, service: WorkerService) -> None:
        self.service = service
        self.spawns: dict[str, str | None] = {}  # agent id → bound job id

    async def pending_jobs(self, limit: int) -> list[PendingJob]:
        """Held jobs waiting for an agent (not in a spawn-retry backoff), oldest first."""
        now = self.service.clock()
        waiting = [job for job in self.service.jobs.values() if job.state == "held" and job.not_before <= now]
        waiting.sort(key=lambda j: j.accepted_at)
        return [
            PendingJob(
                job_id=job.job_id,
                run_id=job.reroute.run_id,
                org_id=job.reroute.org_id,
                runs_on=job.runs_on,
                enqueued_at=job.accepted_at,
                bound_agent_id=job.bound_agent_id,
                note=None,
            )
            for job in waiting[:limit]
        ]

    async def spawn_exists(self, agent_id: str) -> bool:
        """Only this worker spawns for its jobs."""
        return agent_id in self.spawns

    async def set_wait_note(self, job_id: str, note: str) -> None:
        """Logged (the coordinator shows the reroute state)."""
        log.info("job %s %s", job_id, note)

    async def reserve(
        self,
        spawn: Any,
        job: PendingJob | None,
        *,
        entry: ScalerEntry,
        node_id: str,
        boot_id: str,
        token_expires_at: datetime,
        deadline_at: datetime,
    ) -> tuple[str, str] | None:
        """Bind the held job to the spawn and mint its single-use token (memory only)."""
        if job is not None:
            held = self.service.jobs.get(job.job_id)
            if held is None or held.bound_agent_id not in (None, job.bound_agent_id):
                return None
            held.bound_agent_id = spawn.agent_id
        self.spawns[spawn.agent_id] = job.job_id if job is not None else None
        return self.service.tokens.mint(
            labels=list(spawn.label_set.labels),
            mandatory_labels=list(entry.mandatory_labels),
            agent_id=spawn.agent_id,
            expires_at=token_expires_at,
            label=f"scaler:{entry.name}",
        )

    async def set_backend_ref(self, agent_id: str, ref: str) -> None:
        """Nothing to record."""

    async def spawn_failed(
        self, spawn: Any, *, outcome: str, message: str, log_tail: list[str], note: str
    ) -> None:
        """Relay the failure; retry within the job's spawn budget, then give the job back
        (docs/design/cluster.md §4.3)."""
        self._release(spawn)
        job = self.service.jobs.get(spawn.bound_job_id or "")
        if job is None or job.state != "held":
            return
        job.spawn_failures += 1
        budget = job.reroute.spawn_retry
        final = job.spawn_failures >= budget.max_attempts
        await self.service.relay(
            job,
            ScalerEventRelay(
                run_id=job.reroute.run_id,
                job_id=job.job_id,
                agent_id=spawn.agent_id,
                kind="failed",
                detail=message,
                attempt=job.spawn_failures,
                final=final,
                at=format_rfc3339(utc_now()),
            ),
        )
        if final:
            log.warning("job %s: spawn failed %d times; given back", job.job_id, job.spawn_failures)
            self.service._drop(job)
        else:
            job.not_before = self.service.clock() + budget.backoff_ms / 1000
            loop = asyncio.get_running_loop()
            loop.call_later(budget.backoff_ms / 1000 + 0.05, self.service.scaler_wake)

    async def spawn_ended(self, spawn: Any, *, outcome: str, error: str | None) -> None:
        """Token forgotten, binding released."""
        self._release(spawn)

    def _release(self, spawn: Any) -> None:
        if spawn.token_id:
            self.service.tokens.revoke(spawn.token_id)
        self.spawns.pop(spawn.agent_id, None)
        job = self.service.jobs.get(spawn.bound_job_id or "")
        if job is not None and job.bound_agent_id == spawn.agent_id:
            job.bound_agent_id = None

    async def registered(self, spawn: Any) -> bool:
        """Whether the spawn's bound job still waits for it."""
        job = self.service.jobs.get(spawn.bound_job_id or "")
        return job is not None and job.state == "held"

    async def reap(self, node_id: str, boot_id: str, live: set[str], claim_retention_ms: int) -> int:
        """Records of spawns no longer in memory are dropped."""
        lost = [agent_id for agent_id in self.spawns if agent_id not in live]
        for agent_id in lost:
            self.spawns.pop(agent_id, None)
        return len(lost)

    async def end_leftovers(self, node_id: str, boot_id: str) -> None:
        """Nothing recorded survives a restart."""
