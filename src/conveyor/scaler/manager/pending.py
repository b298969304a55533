"""Driving pending jobs (docs/design/scaler.md §3, §5): for each queue row no free connected agent can take,
the label set that serves it and a spawn request, refused while the node drains, the scaler is in backoff or
at capacity; the note each waiting job shows.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from conveyor.execution.queue import AgentSlot, agent_can_take
from conveyor.scaler import store
from conveyor.scaler.labels import Candidate, pick_label_set
from conveyor.scaler.manager.backoff import backoff_note
from conveyor.scaler.manager.core import ManagerCore

Outcome = Literal["spawning", "unschedulable", "draining", "backoff", "at-capacity"]

BATCH = 50


class PendingPart(ManagerCore):
    """Which jobs get a spawn, and what the others wait for."""

    # --- label sets

    def candidates(self) -> list[Candidate]:
        """Every label set of every scaler, in configuration order."""
        found: list[Candidate] = []
        for runtime in self.scalers.values():
            for index, label_set in enumerate(runtime.entry.label_sets):
                found.append(
                    Candidate(
                        scaler=runtime.entry.name,
                        index=index,
                        labels=label_set.all_labels,
                        mandatory_labels=runtime.entry.mandatory_labels,
                        retiring=runtime.retiring,
                    )
                )
        return found

    def can_serve(self, runs_on: dict[str, Any]) -> Candidate | None:
        """The label set a job would get, if any scaler of this node serves it."""
        return pick_label_set(runs_on, self.candidates())

    def wait_note(self, job_id: str, runs_on: dict[str, Any]) -> str | None:
        """For the unschedulable rule: the job's note when some scaler can serve it, else None."""
        candidate = self.can_serve(runs_on)
        if candidate is None:
            return None
        return self.notes.get(job_id) or f"waiting: scaler {candidate.scaler} can start an agent"

    # --- driving pending jobs

    def _free_agents(self) -> list[AgentSlot]:
        """Free connected agents that may take any job they match: a spawned agent takes only its bound job."""
        free: list[AgentSlot] = []
        for agent in self.connected().values():
            slot = agent.free_slot()
            if slot is not None and agent.bound_job_id() is None:
                free.append(slot)
        return free

    async def drive_pending(self) -> None:
        """Request a spawn for each pending row no free connected agent can take (oldest first)."""
        if not self.scalers:
            return
        pending = await self.records.pending_jobs(BATCH)
        bound_to: dict[str, str] = {
            spawn.bound_job_id: spawn.agent_id
            for spawn in self.spawns.values()
            if spawn.bound_job_id is not None and not spawn.ended
        }
        connected = self.connected()
        live_jobs = {job.job_id for job in pending}
        free = self._free_agents()
        for runtime in self.scalers.values():
            runtime.capacity_waiters = 0
        for job_id in [j for j in self.notes if j not in live_jobs]:
            self.notes.pop(job_id, None)
            self._written_notes.pop(job_id, None)
        for job_id in [j for j in self._refused if j not in live_jobs]:
            del self._refused[job_id]
        for agent in connected.values():
            bound = agent.bound_job_id()
            if bound is not None and bound in live_jobs:
                bound_to.setdefault(bound, agent.agent_id)  # a registered agent will claim it
        for job in pending:
            if job.job_id in bound_to or job.runs_on.get("agent_id") is not None:
                continue  # bound to a spawn, or a fan-out host execution pinned to its agent (no spawn serves it)
            if job.bound_agent_id is not None and job.bound_agent_id not in self.spawns:
                if await self.records.spawn_exists(job.bound_agent_id):
                    continue  # another coordinator's spawn is on its way
            taker = next((slot for slot in free if agent_can_take(job.runs_on, slot)), None)
            if taker is not None:
                free.remove(taker)
                continue
            outcome, note = await self.request_scale(job)
            if note is not None:
                await self._note(job.job_id, note)
            if outcome == "spawning":
                bound_to[job.job_id] = "?"

    async def _note(self, job_id: str, note: str) -> None:
        self.notes[job_id] = note
        if self._written_notes.get(job_id) == note:
            return
        await self.records.set_wait_note(job_id, note)
        self._written_notes[job_id] = note

    async def request_scale(self, job: store.PendingJob) -> tuple[Outcome, str | None]:
        """Try to spawn an agent bound to `job`; the outcome and the note to show on the job."""
        candidate = self.can_serve(job.runs_on)
        if candidate is None:
            self._count_refusal(job.job_id, "", "unschedulable")
            return "unschedulable", None
        runtime = self.scalers[candidate.scaler]
        name = runtime.entry.name
        if self.draining():
            self._count_refusal(job.job_id, name, "draining")
            return "draining", f"waiting: this node drains; scaler {name} starts no agent"
        if runtime.next_attempt_at > time.time():
            self._count_refusal(job.job_id, name, "backoff")
            return "backoff", backoff_note(runtime)
        label_set = runtime.entry.label_sets[candidate.index]
        reserved = await self._reserve(runtime, label_set, job=job, warm=False)
        if reserved is None:
            return "spawning", None  # another coordinator's spawn serves it
        if isinstance(reserved, str):
            self._count_refusal(job.job_id, name, "at_capacity")
            runtime.capacity_waiters += 1
            return "at-capacity", f"waiting: {reserved}"
        self._refused.pop(job.job_id, None)
        return "spawning", f"waiting: agent {reserved.agent_id} of scaler {name} is starting"

    def _count_refusal(self, job_id: str, scaler: str, reason: str) -> None:
        if self._refused.get(job_id) == (scaler, reason):
            return
        self._refused[job_id] = (scaler, reason)
        self.metrics.spawn_refusals.labels(scaler, reason).inc()
