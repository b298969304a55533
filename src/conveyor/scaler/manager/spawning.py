"""A spawn from reservation to teardown (docs/design/scaler.md §3): capacity checked and the spawn
record written under the manager's lock, the backend's spawn, its events, a provisioning failure counted for
backoff, the agent's registration and disconnect (the hub's link), and the teardown.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import timedelta
from functools import partial

from conveyor.model.ids import new_id, utc_now
from conveyor.scaler import store
from conveyor.scaler.backend import (
    LabelSetSpec,
    Resources,
    ScalerEvent,
    SpawnContext,
    SpawnFailed,
    SpawnRequest,
)
from conveyor.scaler.manager.backoff import backoff_note, clear_backoff, open_backoff
from conveyor.scaler.manager.core import ManagerCore, ScalerRuntime, Spawn

log = logging.getLogger(__name__)


class SpawnPart(ManagerCore):
    """Spawns: reserve, launch, fail, register, end."""

    # --- capacity and reservation

    def _resources(self, label_set: LabelSetSpec) -> Resources:
        return label_set.resources or self.config.default_resources or Resources()

    def _capacity_refusal(self, runtime: ScalerRuntime, wanted: Resources) -> str | None:
        live = [s for s in self.spawns.values() if not s.ended]
        if len(live) >= self.config.global_max_agents:
            return f"all scalers of this node at capacity (global_max_agents {self.config.global_max_agents})"
        mine = [s for s in live if s.scaler == runtime.entry.name]
        if len(mine) >= runtime.entry.max_agents:
            return f"scaler {runtime.entry.name} at capacity ({len(mine)}/{runtime.entry.max_agents} agents)"
        for cap, group, what in (
            (runtime.entry.resource_cap, mine, f"scaler {runtime.entry.name} resource_cap"),
            (self.config.global_resource_cap, live, "global_resource_cap"),
        ):
            if cap is None:
                continue
            cpus = sum(s.cpus for s in group) + wanted.request_cpus
            memory = sum(s.mem_bytes for s in group) + wanted.request_mem_bytes
            if (cap.request_cpus and cpus > cap.request_cpus) or (
                cap.request_mem_bytes and memory > cap.request_mem_bytes
            ):
                return f"{what} reached"
        return None

    async def _reserve(
        self, runtime: ScalerRuntime, label_set: LabelSetSpec, *, job: store.PendingJob | None, warm: bool
    ) -> Spawn | str | None:
        """The spawn; a capacity refusal; or None when another spawn already serves the job."""
        entry = runtime.entry
        async with self._lock:
            wanted = self._resources(label_set)
            refusal = self._capacity_refusal(runtime, wanted)
            if refusal is not None:
                return refusal
            org_id = job.org_id if job is not None else None
            timeout_ms = await self.knob("scaler_spawn_timeout_ms", org_id)
            ttl_ms = max(await self.knob("agent_token_ttl_ms", None), timeout_ms + 60_000)
            now_mono, now = time.monotonic(), utc_now()
            spawn = Spawn(
                agent_id=new_id(),
                scaler=entry.name,
                label_set=label_set,
                bound_job_id=job.job_id if job is not None else None,
                run_id=job.run_id if job is not None else None,
                org_id=org_id,
                warm=warm,
                cpus=wanted.request_cpus,
                mem_bytes=wanted.request_mem_bytes,
                spawned_mono=now_mono,
                deadline_mono=now_mono + timeout_ms / 1000,
                timeout_ms=timeout_ms,
            )
            self.spawns[spawn.agent_id] = spawn
            try:
                minted = await self.records.reserve(
                    spawn,
                    job,
                    entry=entry,
                    node_id=self.context.node_id,
                    boot_id=self.context.boot_id,
                    token_expires_at=now + timedelta(milliseconds=ttl_ms),
                    deadline_at=now + timedelta(milliseconds=timeout_ms),
                )
            except Exception:
                self.spawns.pop(spawn.agent_id, None)
                raise
            if minted is None:  # another spawn already serves the job
                self.spawns.pop(spawn.agent_id, None)
                return None
            token, spawn.token_id = minted
        log.info(
            "spawning agent %s with scaler %s for %s",
            spawn.agent_id,
            entry.name,
            f"job {spawn.bound_job_id}" if spawn.bound_job_id else "the warm pool",
        )
        self._spawn_task(self._launch(runtime, spawn, token), f"scaler-spawn-{spawn.agent_id}")
        return spawn

    def _agent_env(self, runtime: ScalerRuntime, spawn: Spawn, token: str, url: str) -> dict[str, str]:
        return {
            **spawn.label_set.env,
            "CONVEYOR_AGENT_URL": url,
            "CONVEYOR_AGENT_TOKEN": token,
            "CONVEYOR_AGENT_ID": spawn.agent_id,
            "CONVEYOR_AGENT_LABELS": ",".join(spawn.label_set.labels),
            "CONVEYOR_AGENT_EPHEMERAL": "1",
        }

    async def _launch(self, runtime: ScalerRuntime, spawn: Spawn, token: str) -> None:
        async with runtime.semaphore:
            if spawn.ended:
                return
            url = runtime.entry.orchestrator_url or self.settings.orchestrator_url
            resources = self._resources(spawn.label_set)
            request = SpawnRequest(
                agent_id=spawn.agent_id,
                scaler=runtime.entry.name,
                label_set=spawn.label_set,
                orchestrator_url=url,
                token=token,
                env=self._agent_env(runtime, spawn, token, url),
                limits=resources.limits,
                context=SpawnContext(spawn.bound_job_id, spawn.run_id, spawn.org_id, spawn.warm),
                deadline=spawn.deadline_mono,
            )
            try:
                managed = await runtime.backend.spawn(request, partial(self._on_event, spawn))
            except SpawnFailed as exc:
                await self._spawn_failed(spawn, exc.detail, exc.log_tail, outcome="failed")
                return
            except Exception as exc:
                log.exception("scaler %s: spawn of %s raised", runtime.entry.name, spawn.agent_id)
                await self._spawn_failed(spawn, f"spawn failed: {exc}", [], outcome="failed")
                return
        if managed.backend_ref and not spawn.ended:
            await self.records.set_backend_ref(spawn.agent_id, managed.backend_ref)

    def _on_event(self, spawn: Spawn, event: ScalerEvent) -> None:
        spawn.events.append(event)
        del spawn.events[:-50]
        if event.kind == "failed":
            self._spawn_task(
                self._spawn_failed(spawn, event.detail, list(event.log_tail), outcome="failed"),
                f"scaler-failed-{spawn.agent_id}",
                teardown=True,
            )
        elif event.kind == "exited":
            self._spawn_task(
                self._end(spawn, reason=event.detail), f"scaler-end-{spawn.agent_id}", teardown=True
            )

    # --- failures and teardown

    async def _spawn_failed(self, spawn: Spawn, detail: str, log_tail: list[str], *, outcome: str) -> None:
        """A provisioning failure: tear down, count it for backoff, show it on the job, re-drive."""
        if spawn.ended or spawn.registered:
            if spawn.registered and not spawn.ended:
                await self._end(spawn, reason=detail)
            return
        spawn.ended = True
        runtime = self.scalers.get(spawn.scaler)
        if runtime is not None:
            await self._destroy(runtime, spawn, reason=detail)
            runtime.failures += 1
            base = await self.knob("scaler_provision_backoff_base_ms", None)
            cap = await self.knob("scaler_provision_backoff_max_ms", None)
            most = await self.knob("scaler_provision_max_consecutive_failures", None)
            delay_ms, message = open_backoff(
                runtime, detail, base_ms=base, max_ms=cap, max_consecutive=most, now=time.time()
            )
            asyncio.get_running_loop().call_later(delay_ms / 1000 + 0.05, self.wake)
        else:
            message = detail
        log.warning("scaler %s: agent %s failed: %s", spawn.scaler, spawn.agent_id, message)
        self.metrics.spawns.labels(spawn.scaler, outcome).inc()
        self.metrics.spawn_failures.labels(spawn.scaler, "true" if spawn.bound_job_id else "false").inc()
        note = backoff_note(runtime) if runtime is not None else f"waiting: {message}"
        await self.records.spawn_failed(spawn, outcome=outcome, message=message, log_tail=log_tail, note=note)
        if spawn.bound_job_id is not None:
            self.notes[spawn.bound_job_id] = note
            self._written_notes[spawn.bound_job_id] = note
        self.spawns.pop(spawn.agent_id, None)
        self.wake()

    async def _end(self, spawn: Spawn, *, reason: str) -> None:
        """Tear down an agent whose life ended normally (job done, disconnect, idle, shutdown)."""
        if spawn.ended:
            return
        spawn.ended = True
        runtime = self.scalers.get(spawn.scaler)
        if runtime is not None:
            await self._destroy(runtime, spawn, reason=reason)
        outcome = "registered" if spawn.registered else "failed"
        await self.records.spawn_ended(spawn, outcome=outcome, error=None if spawn.registered else reason)
        self.spawns.pop(spawn.agent_id, None)
        log.info("scaler %s: agent %s ended (%s)", spawn.scaler, spawn.agent_id, reason)
        self.wake()

    async def _destroy(self, runtime: ScalerRuntime, spawn: Spawn, *, reason: str) -> None:
        """The backend's teardown; one that raises is tried again on its own schedule (`host.py`), while the
        spawn's record is closed now (its token revoked, its job freed): what is left is compute, not a claim."""
        destroy = partial(runtime.backend.destroy, spawn.agent_id, reason=reason)
        try:
            await destroy()
        except Exception as exc:
            what = f"agent {spawn.agent_id} of scaler {spawn.scaler}"
            self.teardown_failed(spawn.agent_id, what, destroy, str(exc) or type(exc).__name__)

    # --- registration link (called by the agent hub)

    async def agent_registered(self, agent_id: str) -> str | None:
        """A spawned agent registered: its bound job when that job still waits, else None."""
        spawn = self.spawns.get(agent_id)
        if spawn is None or spawn.ended:
            return None
        spawn.registered = True
        spawn.idle_since = time.monotonic()
        self.metrics.spawns.labels(spawn.scaler, "registered").inc()
        self.metrics.spawn_to_register.labels(spawn.scaler).observe(spawn.idle_since - spawn.spawned_mono)
        runtime = self.scalers.get(spawn.scaler)
        if runtime is not None:
            runtime.backend.mark_registered(agent_id)
            clear_backoff(runtime)
        pending = await self.records.registered(spawn)
        log.info("scaler %s: agent %s registered", spawn.scaler, agent_id)
        return spawn.bound_job_id if pending else None

    def bound_job(self, agent_id: str) -> str | None:
        """The job a spawn was started for, waiting or not: its agent is sent that job or none."""
        spawn = self.spawns.get(agent_id)
        return spawn.bound_job_id if spawn is not None and not spawn.ended else None

    def is_spawned(self, agent_id: str) -> bool:
        return agent_id in self.spawns

    def agent_disconnected(self, agent_id: str) -> None:
        """Any disconnect of a spawned agent ends it (single use)."""
        spawn = self.spawns.get(agent_id)
        if spawn is not None and not spawn.ended:
            self._spawn_task(
                self._end(spawn, reason="agent disconnected"), f"scaler-end-{agent_id}", teardown=True
            )
