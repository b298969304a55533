"""The agent hub's journal on a worker: tokens in memory, agent messages relayed to coordinators as
`job.progress`, `log.chunk` and `event.emit`."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from conveyor.agents.journal import AgentJournal
from conveyor.agents.tokens import AgentAuthRefusal, AgentTokenRow
from conveyor.cluster.messages import LogChunkRelay
from conveyor.execution.logs import masker_for
from conveyor.model import protocol as p

if TYPE_CHECKING:
    from conveyor.cluster.worker.service import WorkerService

log = logging.getLogger(__name__)


class WorkerJournal(AgentJournal):
    """The worker's agent journal: tokens in memory, agent messages relayed to coordinators."""

    def __init__(self, service: WorkerService) -> None:
        self.service = service

    async def reset(self) -> None:
        """Nothing survives a worker restart but the outbox."""

    async def authenticate(self, token: str) -> AgentTokenRow | AgentAuthRefusal:
        """The in-memory token store."""
        return self.service.tokens.authenticate(token)

    async def bind(self, token_id: str, agent_id: str) -> str | None:
        """The in-memory token store."""
        return self.service.tokens.bind(token_id, agent_id)

    async def register(self, connection: Any, register: p.AgentRegister) -> list[str]:
        """Keep jobs the agent still runs for us; the others it reports are not ours."""
        not_owned: list[str] = []
        for item in register.in_flight:
            job = self.service.jobs.get(item.job_id)
            if job is not None and job.agent_id == connection.agent_id:
                connection.jobs.add(item.job_id)
            else:
                not_owned.append(item.job_id)
        return not_owned

    async def apply(self, connection: Any, message: Any) -> None:
        """One agent message."""
        service = self.service
        job = service.jobs.get(getattr(message, "job_id", "") or "")
        if job is not None and job.agent_id != connection.agent_id:
            job = None  # not this agent's to report
        if isinstance(message, p.Heartbeat):
            connection.draining = connection.draining or message.draining
            await connection.send(p.HeartbeatAck(ts=message.ts or time.time()))
        elif isinstance(message, p.JobAck):
            connection.pending_acks.pop(message.re, None)
            connection.answered.discard(message.job_id)
            if job is not None and job.state == "offered":
                job.state = "acked"
        elif isinstance(message, p.JobReject):
            connection.pending_acks.pop(message.re, None)
            connection.jobs.discard(message.job_id)
            connection.answered.discard(message.job_id)
            if message.reason == "draining":
                connection.draining = True
            elif message.reason == "busy":
                connection.busy_until = time.monotonic() + 1.0
            if job is not None:
                job.state, job.agent_id = "held", None
            service.dispatcher.wake()
        elif isinstance(message, p.JobStarted):
            if job is not None:
                job.state = "running"
                await service.relay(
                    job, service.progress(job, "job", "running", data={"agent_id": connection.agent_id})
                )
        elif isinstance(message, p.StepStarted):
            if job is not None:
                data = {"name": message.name, "kind": message.kind, "lock_index": message.lock_index}
                await service.relay(
                    job, service.progress(job, "step", "running", step_index=message.step_index, data=data)
                )
        elif isinstance(message, p.LogChunk):
            if job is not None:
                chunk = LogChunkRelay(
                    job_id=message.job_id,
                    step_index=message.step_index,
                    seq=message.seq,
                    lines=service.mask(job, message.lines),
                    # The agent's attempt (its execution may have begun with an earlier offer of the job),
                    # else the one this worker dispatched; the hop of the offer this worker holds.
                    attempt=message.attempt or job.reroute.attempt,
                    hop=job.reroute.hop,
                )
                await service.relay_log(job, chunk)
        elif isinstance(message, p.StepFinished):
            if job is not None:
                masker = masker_for(job.secret_values())
                step = {
                    "step_index": message.step_index,
                    "name": message.name,
                    "kind": message.kind,
                    "status": message.status,
                    "reason": message.reason,
                    "exit_code": message.exit_code,
                    "outputs": masker.mask_json(message.outputs),
                    "attempts": message.attempts,
                    "error": masker.mask(message.error) if message.error else None,
                    "duration_ms": message.duration_ms,
                }
                job.final_steps[message.step_index] = step
                await service.relay(
                    job,
                    service.progress(job, "step", message.status, step_index=message.step_index, data=step),
                )
            await connection.send(p.StatusAck(oseq=message.oseq))
        elif isinstance(message, p.JobFinished):
            if job is not None:
                progress = service.progress(
                    job,
                    "job",
                    message.status,
                    attempt=message.attempt or job.reroute.attempt,
                    data={
                        "reason": message.reason,
                        "outputs": masker_for(job.secret_values()).mask_json(message.outputs),
                        "agent_id": connection.agent_id,
                    },
                    final_steps=[job.final_steps[i] for i in sorted(job.final_steps)],
                )
                await service.finish(job, progress)  # durable before the agent hears "done"
            await connection.send(p.StatusAck(oseq=message.oseq))
            connection.jobs.discard(message.job_id)
            connection.idle = time.monotonic()
            service.dispatcher.wake()
        elif isinstance(message, p.EventEmit):
            if job is None:
                result = p.EventEmitResult(
                    request_id=message.request_id,
                    error=p.EmitError(code="not_owned", detail="the job is not this agent's"),
                )
            else:
                result = await service.emit(job, message)
            await connection.send(result)
            await connection.send(p.StatusAck(oseq=message.oseq))

    async def disconnected(self, connection: Any, code: int) -> None:
        """Jobs of a lost agent: not started → held again; running → failed `agent_lost` (spawned agents
        are single use, so nothing reconnects to finish them)."""
        service = self.service
        for job in list(service.jobs.values()):
            if job.agent_id != connection.agent_id:
                continue
            if job.state in ("offered", "acked"):
                job.state, job.agent_id = "held", None
            else:
                progress = service.progress(
                    job,
                    "job",
                    "failed",
                    data={"reason": "agent_lost", "agent_id": connection.agent_id},
                    final_steps=[job.final_steps[i] for i in sorted(job.final_steps)],
                )
                await service.finish(job, progress)
        service.dispatcher.wake()

    async def sweep(self, connections: Mapping[str, Any]) -> None:
        """Offers not answered within the dispatch ack timeout: the agent is closed (4031), the job held again."""
        service = self.service
        now = service.clock()
        for job in list(service.jobs.values()):
            if job.state != "offered" or job.agent_id is None:
                continue
            if now - job.offered_at < service.dispatch_ack_timeout_ms / 1000:
                continue
            connection = connections.get(job.agent_id)
            if connection is not None and job.job_id in connection.answered:
                continue
            job.state, agent_id, job.agent_id = "held", job.agent_id, None
            if connection is not None:
                connection.jobs.discard(job.job_id)
                await connection.close(p.CLOSE_ACK_TIMEOUT, "dispatch ack timeout")
            log.warning("agent %s did not acknowledge job %s in time", agent_id, job.job_id)
        service.dispatcher.wake()
