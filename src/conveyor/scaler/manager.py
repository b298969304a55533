"""The scaler manager: spawns one-shot agents for queued jobs and cleans up after them
(docs/design/scaler.md §3).

One `ScalerManager` per orchestrator. Its loop (woken with the dispatcher, polled every second)
looks at pending queue rows that no connected agent can take now, picks a label set
(docs/design/scaler.md §5), checks capacity and provision backoff, mints a single-use ephemeral token bound to
a fresh agent id, writes the spawn record and starts the compute. The agent hub tells it when a spawned agent
registers (`agent_registered`; `bound_job` is the one job the dispatcher may send that agent) and when it
disconnects (`agent_disconnected`, which tears the compute down: single use). The same loop enforces
registration deadlines, idle limits and warm pools.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any, Literal, Protocol

from conveyor.aio import wait_event
from conveyor.db.engine import Database
from conveyor.errors import ConveyorError
from conveyor.execution.queue import AgentSlot, agent_can_take
from conveyor.model.ids import new_id, utc_now
from conveyor.scaler import claims, store
from conveyor.scaler.backend import (
    BackendContext,
    LabelSetSpec,
    LiveItem,
    Resources,
    ScalerBackend,
    ScalerEntry,
    ScalerEvent,
    SpawnContext,
    SpawnFailed,
    SpawnRequest,
)
from conveyor.scaler.config import ScalerConfig, ScalerConfigError
from conveyor.scaler.labels import Candidate, pick_label_set
from conveyor.scaler.metrics import ScalerMetrics
from conveyor.scaler.records import DatabaseSpawnRecords, SpawnRecords

log = logging.getLogger(__name__)

Outcome = Literal["spawning", "unschedulable", "draining", "backoff", "at-capacity"]

BATCH = 50
LOOP_POLL_S = 1.0
WARM_FILL_S = 5.0
UNCLAIMED_IDLE_S = 60.0
SWEEP_EVERY_S = 15 * 60.0


def backoff_delay_ms(failures: int, base_ms: int, max_ms: int) -> int:
    """`min(base · 2^(n−1), max)` after `n` consecutive provisioning failures; 0 for none (pure)."""
    if failures <= 0:
        return 0
    return int(min(base_ms * 2 ** (failures - 1), max_ms))


def failure_message(detail: str, failures: int, max_consecutive: int) -> str:
    """The error as shown: from `max_consecutive` failures on it says how many in a row (pure)."""
    if failures >= max_consecutive:
        return f"repeated failure ({failures} in a row): {detail}"
    return detail


class ReloadInProgress(ConveyorError):
    """Another reload is running."""


class AgentView(Protocol):
    """A connected agent as the hub holds it."""

    agent_id: str
    labels: tuple[str, ...]
    mandatory_labels: tuple[str, ...]
    jobs: set[str]

    def free_slot(self) -> AgentSlot | None: ...

    def bound_job_id(self) -> str | None: ...


@dataclass
class Spawn:
    """One spawned agent, from reservation to teardown (this node's memory)."""

    agent_id: str
    scaler: str
    label_set: LabelSetSpec
    bound_job_id: str | None
    run_id: str | None
    org_id: str | None
    warm: bool
    cpus: float
    mem_bytes: int
    spawned_mono: float
    deadline_mono: float
    timeout_ms: int
    token_id: str | None = None
    registered: bool = False
    took_job: bool = False
    idle_since: float = 0.0
    ended: bool = False
    events: list[ScalerEvent] = field(default_factory=list)


@dataclass
class ScalerRuntime:
    """A configured scaler on this node: its backend and its provision-backoff state."""

    entry: ScalerEntry
    backend: ScalerBackend
    semaphore: asyncio.Semaphore
    retiring: bool = False
    failures: int = 0
    next_attempt_at: float = 0.0  # wall clock
    last_error: str | None = None
    failing: bool = False
    backoff_ms: int = 0  # the window set by the last failure
    capacity_waiters: int = 0
    last_warm_fill: float = 0.0


@dataclass(frozen=True)
class ManagerSettings:
    """What the manager reads from the node (cluster/org settings are read live through `knob`)."""

    orchestrator_url: str
    unclaimed_idle_s: float = UNCLAIMED_IDLE_S
    loop_poll_s: float = LOOP_POLL_S
    warm_fill_s: float = WARM_FILL_S
    claim_retention_ms: int = claims.DEFAULT_RETENTION_MS


class ScalerManager:
    """This node's scaler manager."""

    def __init__(
        self,
        *,
        db: Database | None = None,
        records: SpawnRecords | None = None,
        context: BackendContext,
        config: ScalerConfig,
        registry: Mapping[str, type[ScalerBackend]],
        settings: ManagerSettings,
        knob: Callable[[str, str | None], Awaitable[int]],
        load_config: Callable[[], ScalerConfig],
        connected: Callable[[], Mapping[str, AgentView]] = dict,
        draining: Callable[[], bool] = lambda: False,
        metrics: ScalerMetrics | None = None,
    ) -> None:
        self.db = db
        if records is None:
            assert db is not None, "a scaler manager without spawn records keeps them in the database"
            records = DatabaseSpawnRecords(db)
        self.records = records
        self.context = context
        self.config = config
        self.registry = registry
        self.settings = settings
        self.knob = knob
        self.load_config = load_config
        self.connected = connected
        self.draining = draining
        self.metrics = metrics or ScalerMetrics()
        self.scalers: dict[str, ScalerRuntime] = {}
        self.spawns: dict[str, Spawn] = {}
        self.notes: dict[str, str] = {}
        # The refusal each waiting job was last counted for: a job refused round after round for the
        # same reason counts once (the metric counts refusals, not polls).
        self._refused: dict[str, tuple[str, str]] = {}
        self._written_notes: dict[str, str] = {}
        self._lock = asyncio.Lock()
        self._reload_lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[Any]] = set()
        self.reloads = {"applied": 0, "failed": 0}
        self._last_sweep = 0.0
        self._last_reap = time.monotonic()
        for entry in config.entries:
            self.scalers[entry.name] = self._runtime(entry)

    def _runtime(self, entry: ScalerEntry) -> ScalerRuntime:
        backend = self.registry[entry.type](entry, self.context)
        return ScalerRuntime(
            entry=entry, backend=backend, semaphore=asyncio.Semaphore(entry.max_concurrent_spawns)
        )

    # --- lifecycle

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
        await asyncio.gather(
            *(self._end(spawn, reason="orchestrator stopping") for spawn in list(self.spawns.values())),
            return_exceptions=True,
        )
        background = list(self._background)
        for task in background:
            task.cancel()
        # Waited for, so none is still using the database when the engine is disposed after us.
        await asyncio.gather(*background, return_exceptions=True)

    def wake(self) -> None:
        """Something changed (rows enqueued, capacity freed, backoff over, reload): run a round soon."""
        self._wake.set()

    async def _run(self) -> None:
        while True:
            self._wake.clear()
            try:
                await self.round()
            except Exception:
                log.exception("scaler round failed")
            await wait_event(self._wake, self.settings.loop_poll_s)

    def _spawn_task(self, coroutine: Awaitable[Any], name: str) -> None:
        task = asyncio.ensure_future(coroutine)
        task.set_name(name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def round(self) -> None:
        """One pass: deadlines and idle agents, pending jobs, warm pools, retiring scalers."""
        await self._housekeeping()
        if time.monotonic() - self._last_sweep >= SWEEP_EVERY_S:
            await self.sweep_backends()
        if time.monotonic() - self._last_reap >= await self.knob("scaler_reap_interval_ms", None) / 1000:
            self._last_reap = time.monotonic()
            await self.reap_records()
        await self.drive_pending()
        await self._fill_warm_pools()
        for name, runtime in list(self.scalers.items()):
            if runtime.retiring and not any(s.scaler == name for s in self.spawns.values()):
                del self.scalers[name]
                log.info("scaler %s retired", name)

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
            if job.job_id in bound_to:
                continue
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
            return "backoff", self._backoff_note(runtime)
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

    def _backoff_note(self, runtime: ScalerRuntime) -> str:
        until = datetime.fromtimestamp(runtime.next_attempt_at, UTC).isoformat(timespec="seconds")
        failures = runtime.failures
        return (
            f"waiting: scaler {runtime.entry.name} in provision backoff until {until} "
            f"({failures} failure{'s' if failures != 1 else ''}): {runtime.last_error}"
        )

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
            )
        elif event.kind == "exited":
            self._spawn_task(self._end(spawn, reason=event.detail), f"scaler-end-{spawn.agent_id}")

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
            with contextlib.suppress(Exception):
                await runtime.backend.destroy(spawn.agent_id, reason=detail)
            runtime.failures += 1
            base = await self.knob("scaler_provision_backoff_base_ms", None)
            cap = await self.knob("scaler_provision_backoff_max_ms", None)
            most = await self.knob("scaler_provision_max_consecutive_failures", None)
            delay_ms = backoff_delay_ms(runtime.failures, base, max(cap, base))
            runtime.next_attempt_at = time.time() + delay_ms / 1000
            runtime.backoff_ms = delay_ms
            runtime.last_error = failure_message(detail, runtime.failures, most)
            runtime.failing = runtime.failures >= most
            message = runtime.last_error
            asyncio.get_running_loop().call_later(delay_ms / 1000 + 0.05, self.wake)
        else:
            message = detail
        log.warning("scaler %s: agent %s failed: %s", spawn.scaler, spawn.agent_id, message)
        self.metrics.spawns.labels(spawn.scaler, outcome).inc()
        self.metrics.spawn_failures.labels(spawn.scaler, "true" if spawn.bound_job_id else "false").inc()
        note = self._backoff_note(runtime) if runtime is not None else f"waiting: {message}"
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
            try:
                await runtime.backend.destroy(spawn.agent_id, reason=reason)
            except Exception:
                log.exception("scaler %s: destroying agent %s failed", spawn.scaler, spawn.agent_id)
        outcome = "registered" if spawn.registered else "failed"
        await self.records.spawn_ended(spawn, outcome=outcome, error=None if spawn.registered else reason)
        self.spawns.pop(spawn.agent_id, None)
        log.info("scaler %s: agent %s ended (%s)", spawn.scaler, spawn.agent_id, reason)
        self.wake()

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
            runtime.failures, runtime.next_attempt_at, runtime.failing = 0, 0.0, False
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
            self._spawn_task(self._end(spawn, reason="agent disconnected"), f"scaler-end-{agent_id}")

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
        round): spawn rows of this node and boot with no spawn in memory are moved to the history."""
        return await self.records.reap(
            self.context.node_id, self.context.boot_id, set(self.spawns), self.settings.claim_retention_ms
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

    # --- dead-item sweeps

    async def sweep_backends(self) -> None:
        """Backends with a dead-item sweep (firecracker: TAPs, addresses, directories) run it (boot, 15 min)."""
        self._last_sweep = time.monotonic()
        for runtime in list(self.scalers.values()):
            sweep = getattr(runtime.backend, "sweep", None)
            if not callable(sweep):
                continue
            try:
                report = await sweep()
            except Exception as exc:
                log.warning("scaler %s: dead-item sweep failed: %s", runtime.entry.name, exc)
                continue
            log.info("scaler %s: dead-item sweep: %s", runtime.entry.name, report)

    # --- restart

    async def live_items(self) -> list[tuple[ScalerBackend | None, LiveItem]]:
        """Everything live on this host of every backend type this node knows (one listing per type)."""
        from conveyor.scaler.bare_metal import list_records

        seen: set[str] = set()
        items: list[tuple[ScalerBackend | None, LiveItem]] = []
        for runtime in self.scalers.values():
            if runtime.entry.type in seen:
                continue
            seen.add(runtime.entry.type)
            try:
                for item in await runtime.backend.list_live():
                    items.append((runtime.backend, item))
            except Exception:
                log.exception("listing live items of scaler %s failed", runtime.entry.name)
        if "bare-metal" not in seen:
            items.extend((None, item) for item in list_records(self.context.home / "scaler" / "bare-metal"))
        return items

    async def stop_item(self, backend: ScalerBackend | None, item: LiveItem) -> None:
        """End one live item through its backend (bare-metal records also without one)."""
        if backend is not None:
            await backend.stop_live(item)
            return
        from conveyor.scaler.bare_metal import DEFAULT_TERMINATE_GRACE_S, stop_recorded

        base = self.context.home / "scaler"
        await stop_recorded(base / "bare-metal", base / "work", item, DEFAULT_TERMINATE_GRACE_S)

    async def end_leftovers(self) -> list[str]:
        """At boot: end live items stamped with this node and an older boot; close their spawn rows."""
        ended: list[str] = []
        for backend, item in await self.live_items():
            if item.node_marker != self.context.node_id or item.boot_marker == self.context.boot_id:
                continue
            try:
                await self.stop_item(backend, item)
            except Exception:
                log.exception("ending leftover %s %s failed", item.kind, item.vm_id)
                continue
            ended.append(item.vm_id)
            log.warning(
                "ended leftover agent %s (%s %s, pid %s) of an older boot %s of this node",
                item.vm_id,
                item.backend,
                item.kind,
                item.pid,
                item.boot_marker,
                extra={"agent_id": item.agent_id, "boot_marker": item.boot_marker},
            )
        await self.records.end_leftovers(self.context.node_id, self.context.boot_id)
        return ended

    # --- reload

    async def reload(self) -> dict[str, Any]:
        """Re-read and validate every file; apply all of it or nothing. Raises `ScalerConfigError`."""
        if self._reload_lock.locked():
            raise ReloadInProgress("a scaler reload is already in progress")
        async with self._reload_lock:
            try:
                config = await asyncio.to_thread(self.load_config)
                problems: list[str] = []
                for entry in config.entries:
                    current = self.scalers.get(entry.name)
                    if current is None:
                        continue
                    if current.entry.type != entry.type:
                        problems.append(
                            f"{entry.source}: scalers[{entry.name}].type: changing a scaler's type "
                            f"({current.entry.type} → {entry.type}) is not reloadable; remove it and add it "
                            "under a new name"
                        )
                        continue
                    problems.extend(
                        f"{entry.source}: scalers[{entry.name}].{p}"
                        for p in current.backend.validate_reload(entry)
                    )
                if problems:
                    raise ScalerConfigError(problems)
            except ScalerConfigError:
                self.reloads["failed"] += 1
                self.metrics.config_reloads.labels("failed").inc()
                raise
            async with self._lock:
                names = {entry.name for entry in config.entries}
                for entry in config.entries:
                    current = self.scalers.get(entry.name)
                    if current is None:
                        self.scalers[entry.name] = self._runtime(entry)
                        continue
                    changed = current.entry != entry
                    current.backend.apply_reload(entry)
                    current.entry = entry
                    current.retiring = False
                    if changed:  # the operator changed it: give it a fresh start
                        current.failures, current.next_attempt_at, current.failing = 0, 0.0, False
                        current.semaphore = asyncio.Semaphore(entry.max_concurrent_spawns)
                for name, runtime in self.scalers.items():
                    if name not in names:
                        runtime.retiring = True
                # Keep config order: reorder the map to the file's order, retiring ones last.
                ordered = {e.name: self.scalers[e.name] for e in config.entries}
                ordered.update({n: r for n, r in self.scalers.items() if n not in ordered})
                self.scalers = ordered
                self.config = config
                self.notes.clear()
            self.reloads["applied"] += 1
            self.metrics.config_reloads.labels("applied").inc()
            log.info("scaler configuration reloaded (%d scalers)", len(config.entries))
            self.wake()
            return {"applied": True, "scalers": [e.name for e in config.entries]}

    # --- status

    def status(self) -> list[dict[str, Any]]:
        """Per scaler: capacity, active, warm, backoff state and last error (docs/design/scaler.md §7)."""
        now = time.time()
        connected = self.connected()
        result: list[dict[str, Any]] = []
        for name, runtime in self.scalers.items():
            entry = runtime.entry
            # A spawn leaves `spawns` only once its teardown is over: one being torn down (SIGTERM
            # grace, slow exit) is still active, so `active == 0` means no agent process is left.
            mine = [s for s in self.spawns.values() if s.scaler == name]
            live = [s for s in mine if not s.ended]
            warm_idle = sum(
                1
                for s in live
                if s.warm
                and s.registered
                and not s.took_job
                and not getattr(connected.get(s.agent_id), "jobs", None)
            )
            in_backoff = runtime.next_attempt_at > now
            state = "retiring" if runtime.retiring else "failing" if runtime.failing else "active"
            result.append(
                {
                    "name": name,
                    "type": entry.type,
                    "state": state,
                    "max_agents": entry.max_agents,
                    "active": len(mine),
                    "spawning": sum(1 for s in live if not s.registered),
                    "warm_idle": warm_idle,
                    "warm_target": entry.warm_pool_size * len(entry.label_sets),
                    "label_sets": [list(ls.all_labels) for ls in entry.label_sets],
                    "mandatory_labels": list(entry.mandatory_labels),
                    "runtime": getattr(runtime.backend, "runtime_name", None),
                    "engine": getattr(runtime.backend, "engine_address", None),
                    "backoff": {
                        "state": "backoff" if in_backoff else "ready",
                        "consecutive_failures": runtime.failures,
                        "next_attempt_at": (
                            datetime.fromtimestamp(runtime.next_attempt_at, UTC).isoformat()
                            if in_backoff
                            else None
                        ),
                        "last_error": runtime.last_error,
                    },
                    "cpus_used": sum(s.cpus for s in mine),
                    "memory_bytes_used": sum(s.mem_bytes for s in mine),
                }
            )
        return result
