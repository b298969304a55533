"""The scaler manager's loop (docs/design/scaler.md §3): started after the leftovers of an older boot are
ended, woken with the dispatcher and polled every second; each round enforces registration deadlines and
idle limits, sweeps, reaps and reattempts failed teardowns on their own periods, drives the pending jobs,
fills warm pools and lets retired scalers go.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from conveyor.aio import wait_event
from conveyor.scaler.manager.core import ManagerCore, Spawn

log = logging.getLogger(__name__)

SWEEP_EVERY_S = 15 * 60.0


class LoopPart(ManagerCore):
    """The loop and what each round does besides driving pending jobs."""

    async def start(self) -> None:
        """End what an older boot of this node left, then begin the loop."""
        await self.end_leftovers()
        await self.sweep_backends()
        self._task = asyncio.create_task(self._run(), name="scaler-manager")

    async def stop(self) -> None:
        """Stop the loop and tear down every agent this node spawned."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        # A teardown under way ends what it began: cancelled, it would leave its agent running and its row
        # open (`_end` of that spawn, below, returns at once: the spawn is already ending).
        await asyncio.gather(*list(self._teardowns), return_exceptions=True)
        await asyncio.gather(
            *(self._end(spawn, reason="orchestrator stopping") for spawn in list(self.spawns.values())),
            return_exceptions=True,
        )
        # A teardown that kept failing gets a last attempt; what still fails is ended by the next boot of this
        # node (its leftovers, `host.py`).
        await asyncio.gather(
            *(reattempt.retry() for reattempt in list(self.failed_teardowns.values())), return_exceptions=True
        )
        background = list(self._background)
        for task in background:
            task.cancel()
        # Waited for, so none is still using the database when the engine is disposed after us.
        await asyncio.gather(*background, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            self._wake.clear()
            try:
                await self.round()
            except Exception:
                log.exception("scaler round failed")
            await wait_event(self._wake, self.settings.loop_poll_s)

    async def round(self) -> None:
        """One pass: deadlines and idle agents, pending jobs, warm pools, retiring scalers."""
        await self._housekeeping()
        if time.monotonic() - self._last_sweep >= SWEEP_EVERY_S:
            await self.sweep_backends()
        if time.monotonic() - self._last_reap >= await self.knob("scaler_reap_interval_ms", None) / 1000:
            self._last_reap = time.monotonic()
            await self.reap_records()
        await self.reattempt_teardowns()
        await self.drive_pending()
        await self._fill_warm_pools()
        for name, runtime in list(self.scalers.items()):
            if runtime.retiring and not any(s.scaler == name for s in self.spawns.values()):
                del self.scalers[name]
                log.info("scaler %s retired", name)

    # --- deadlines, idle agents

    async def _housekeeping(self) -> None:
        now = time.monotonic()
        connected = self.connected()
        for spawn in list(self.spawns.values()):
            if spawn.ended:
                continue
            if not spawn.registered:
                if now >= spawn.deadline_mono:
                    await self._deadline_passed(spawn)
                continue
            agent = connected.get(spawn.agent_id)
            if agent is None:
                continue
            if agent.jobs:
                spawn.took_job = True
                spawn.idle_since = now
                continue
            runtime = self.scalers.get(spawn.scaler)
            if spawn.warm and not spawn.took_job:
                limit = runtime.entry.warm_idle_timeout_s if runtime is not None else 0.0
                if now - spawn.idle_since > limit:
                    await self._end(spawn, reason="warm agent idle timeout")
            elif now - spawn.idle_since > self.settings.unclaimed_idle_s:
                await self._end(spawn, reason=f"idle for {self.settings.unclaimed_idle_s:.0f} s")

    async def _deadline_passed(self, spawn: Spawn) -> None:
        runtime = self.scalers.get(spawn.scaler)
        tail = runtime.backend.log_tail(spawn.agent_id) if runtime is not None else []
        seconds = spawn.timeout_ms / 1000
        shown = f"{seconds:.0f}" if seconds == int(seconds) else f"{seconds:g}"
        await self._spawn_failed(spawn, f"agent did not register within {shown} s", tail, outcome="timed_out")

    async def reap_records(self) -> int:
        """The node-local reaper (every `scaler_reap_interval_ms`; deadlines themselves are checked every
        round): spawn rows of this node and boot with no spawn in memory are moved to the history, and claims
        used or expired longer than `scaler_claim_retention_ms` ago are deleted."""
        retention_ms = await self.knob("scaler_claim_retention_ms", None)
        return await self.records.reap(
            self.context.node_id, self.context.boot_id, set(self.spawns), retention_ms
        )

    # --- warm pools

    async def _fill_warm_pools(self) -> None:
        now = time.monotonic()
        connected = self.connected()
        for runtime in list(self.scalers.values()):
            entry = runtime.entry
            if entry.warm_pool_size <= 0 or runtime.retiring or self.draining():
                continue
            if runtime.next_attempt_at > time.time() or runtime.capacity_waiters:
                continue
            for label_set in entry.label_sets:
                have = 0
                for spawn in self.spawns.values():
                    if (
                        spawn.ended
                        or not spawn.warm
                        or spawn.scaler != entry.name
                        or spawn.label_set != label_set
                    ):
                        continue
                    agent = connected.get(spawn.agent_id)
                    if not spawn.registered or (agent is not None and not agent.jobs and not spawn.took_job):
                        have += 1
                for _ in range(max(0, entry.warm_pool_size - have)):
                    reserved = await self._reserve(runtime, label_set, job=None, warm=True)
                    if not isinstance(reserved, Spawn):
                        break
            runtime.last_warm_fill = now
