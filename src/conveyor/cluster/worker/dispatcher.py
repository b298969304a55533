"""The worker's dispatcher: hands held jobs to connected agents with a free matching slot."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any

from conveyor.cluster.worker.held import HeldJob
from conveyor.execution.queue import agent_can_take

if TYPE_CHECKING:
    from conveyor.cluster.worker.service import WorkerService

log = logging.getLogger(__name__)


class WorkerDispatcher:
    """Hands held jobs to connected agents with a free matching slot (a spawned agent only its bound job)."""

    def __init__(self, service: WorkerService) -> None:
        self.service = service
        self.agents: dict[str, Any] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def wake(self) -> None:
        """Held jobs or capacity changed."""
        self._wake.set()

    async def start(self) -> None:
        """Begin dispatching."""
        self._task = asyncio.create_task(self._run(), name="worker-dispatcher")

    async def stop(self) -> None:
        """Stop dispatching."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    await self._wake.wait()
            self._wake.clear()
            try:
                await self.dispatch_round()
            except Exception:
                log.exception("worker dispatch round failed")

    async def dispatch_round(self) -> int:
        """Offer each held job to an agent that can take it; how many were offered."""
        sent = 0
        for job in sorted(self.service.jobs.values(), key=lambda j: j.accepted_at):
            if job.state != "held":
                continue
            link = self._taker(job)
            if link is None:
                continue
            dispatch = job.dispatch()
            job.state, job.agent_id, job.dispatch_id = "offered", link.agent_id, dispatch.id
            job.offered_at = self.service.clock()
            if await link.offer(dispatch):
                sent += 1
                log.info("job %s dispatched to agent %s", job.job_id, link.agent_id)
            else:
                job.state, job.agent_id = "held", None
        return sent

    def _taker(self, job: HeldJob) -> Any:
        links = sorted(self.agents.values(), key=lambda a: a.idle_since())
        bound = next((a for a in links if a.bound_job_id() == job.job_id and a.free_slot()), None)
        if bound is not None:
            return bound
        for link in links:
            slot = link.free_slot()
            if slot is None or link.bound_job_id() is not None:
                continue  # a spawned agent takes its bound job or none (docs/design/execution.md §5)
            if agent_can_take(job.runs_on, slot):
                return link
        return None
