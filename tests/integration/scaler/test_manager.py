"""The scaler manager against a real database (SQLite and PostgreSQL) with a recording test backend.

The backend here is a test double named as such (`RecordingBackend`): it starts no compute, records
every call and lets a test decide whether a spawn starts, fails or exits. Real processes are
covered by `test_bare_metal.py` and the end-to-end tests.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml
from sqlalchemy import insert, select, update

from conveyor.agents import store as agent_store
from conveyor.agents.tokens import AgentAuthRefusal
from conveyor.db.engine import Database
from conveyor.db.tables import (
    agent_tokens,
    dispatch_queue,
    jobs,
    run_timeline,
    scaler_spawn_history,
    scaler_spawns,
)
from conveyor.execution.queue import AgentSlot
from conveyor.execution.sweeps import SweepSettings, classify_queue
from conveyor.model.ids import utc_now
from conveyor.scaler.backend import (
    BackendContext,
    LiveItem,
    ManagedAgent,
    OnEvent,
    ScalerBackend,
    ScalerEvent,
    SpawnFailed,
    SpawnRequest,
)
from conveyor.scaler.config import Host, ScalerConfigError, parse_config
from conveyor.scaler.manager import ManagerSettings, ReloadInProgress, ScalerManager
from tests.support.queued import queue_job
from tests.support.waiting import async_wait_until

HOST = Host(os="linux", arch="x86_64")
NODE, BOOT = "node-1", "boot-2"


class RecordingBackend(ScalerBackend):
    """Test double: records spawns and destroys; `mode` decides what a spawn does."""

    type: ClassVar[str] = "recording"
    scaler_keys: ClassVar[frozenset[str]] = frozenset({"mode"})
    instances: ClassVar[list[RecordingBackend]] = []

    def __init__(self, entry: Any, context: Any) -> None:
        super().__init__(entry, context)
        self.spawned: list[SpawnRequest] = []
        self.destroyed: list[tuple[str, str]] = []
        self.registered: list[str] = []
        self.events: dict[str, OnEvent] = {}
        self.agents: dict[str, ManagedAgent] = {}
        self.live: list[LiveItem] = []
        self.stopped: list[str] = []
        self.mode = "start"
        # When set, `destroy` waits for it: a teardown that takes its time (SIGTERM grace, slow exit).
        self.destroy_gate: asyncio.Event | None = None
        # This many teardowns raise before they succeed (an engine that refuses, a process that will not die).
        self.failing_destroys = 0
        RecordingBackend.instances.append(self)

    async def spawn(self, request: SpawnRequest, on_event: OnEvent) -> ManagedAgent:
        self.spawned.append(request)
        if self.mode == "raise":
            raise SpawnFailed("exec /opt/agent: no such file", ["line 1", "line 2"])
        managed = ManagedAgent(
            request.agent_id, self.name, request.labels, backend_ref=f"ref-{len(self.spawned)}"
        )
        self.agents[request.agent_id] = managed
        self.events[request.agent_id] = on_event
        return managed

    async def destroy(self, agent_id: str, *, reason: str, grace_s: float | None = None) -> None:
        self.destroyed.append((agent_id, reason))
        if self.destroy_gate is not None:
            await self.destroy_gate.wait()
        if self.failing_destroys:
            self.failing_destroys -= 1
            raise RuntimeError(f"the engine refused to remove {agent_id}")
        self.agents.pop(agent_id, None)

    def mark_registered(self, agent_id: str) -> None:
        self.registered.append(agent_id)

    def is_alive(self, agent_id: str) -> bool:
        return agent_id in self.agents

    async def list_live(self) -> list[LiveItem]:
        return list(self.live)

    async def stop_live(self, item: LiveItem) -> None:
        self.stopped.append(item.vm_id)

    def managed(self) -> dict[str, ManagedAgent]:
        return dict(self.agents)

    def log_tail(self, agent_id: str) -> list[str]:
        return ["tail of " + agent_id]


@dataclass
class FakeAgent:
    """A connected agent as the hub would hold it (test double)."""

    agent_id: str
    labels: tuple[str, ...]
    mandatory_labels: tuple[str, ...] = ()
    jobs: set[str] = field(default_factory=set)
    bound: str | None = None

    def free_slot(self) -> AgentSlot | None:
        return None if self.jobs else AgentSlot(self.agent_id, self.labels, self.mandatory_labels)

    def bound_job_id(self) -> str | None:
        return self.bound


REGISTRY = {"recording": RecordingBackend}


def config_text(**overrides: Any) -> str:
    scaler = {
        "name": "rec",
        "type": "recording",
        "max_agents": 4,
        "label_sets": [{"labels": ["linux"], "env": {"FROM_SET": "1"}}],
    }
    scaler.update(overrides.pop("scaler", {}))
    document = {"version": 1, "scalers": [scaler, *overrides.pop("more", [])], **overrides}
    return yaml.safe_dump(document)


class Harness:
    """A manager on a fresh database, its config file, knobs and connected agents."""

    def __init__(self, db: Database, home: Path) -> None:
        self.db = db
        self.home = home
        self.path = home / "scalers.yaml"
        self.knobs: dict[str, int] = {
            "scaler_spawn_timeout_ms": 300_000,
            "agent_token_ttl_ms": 3_600_000,
            "scaler_provision_backoff_base_ms": 1000,
            "scaler_provision_backoff_max_ms": 3000,
            "scaler_provision_max_consecutive_failures": 3,
            "scaler_reap_interval_ms": 60_000,
            "scaler_reap_reattempt_interval_ms": 30_000,
            "scaler_claim_retention_ms": 86_400_000,
        }
        # The manager's monotonic clock for teardown reattempts, stepped by the tests.
        self.now = 0.0
        self.connected: dict[str, FakeAgent] = {}
        self.manager: ScalerManager | None = None

    def load(self) -> Any:
        documents = [(str(self.path), yaml.safe_load(self.path.read_text()), True)]
        return parse_config(documents, host=HOST, registry=REGISTRY)

    async def knob(self, name: str, org_id: str | None) -> int:
        return self.knobs[name]

    async def start(self, text: str | None = None) -> ScalerManager:
        RecordingBackend.instances.clear()
        self.path.write_text(text or config_text())

        async def setting(name: str) -> int:
            return await self.knob(name, None)

        self.manager = ScalerManager(
            db=self.db,
            context=BackendContext(home=self.home, node_id=NODE, boot_id=BOOT, cluster_setting=setting),
            config=self.load(),
            registry=REGISTRY,
            settings=ManagerSettings(orchestrator_url="ws://127.0.0.1:9/ws", unclaimed_idle_s=1.0),
            knob=self.knob,
            load_config=self.load,
            connected=lambda: self.connected,
            clock=lambda: self.now,
        )
        await self.manager.end_leftovers()
        return self.manager

    def backend(self, name: str = "rec") -> RecordingBackend:
        assert self.manager is not None
        backend = self.manager.scalers[name].backend
        assert isinstance(backend, RecordingBackend)
        return backend

    async def round(self) -> None:
        """One manager round, then its spawn tasks."""
        assert self.manager is not None
        await self.manager.round()
        await self.settle()

    async def settle(self) -> None:
        """Let the manager's background tasks (failed/exited handling) finish."""
        assert self.manager is not None
        for _ in range(100):
            pending = [t for t in self.manager._background if not t.done()]
            if not pending:
                return
            for task in pending:
                await task

    async def stop(self) -> None:
        if self.manager is not None:
            await self.manager.stop()


@pytest.fixture
async def harness(database: Database, tmp_path: Path) -> Any:
    made = Harness(database, tmp_path)
    try:
        yield made
    finally:
        await made.stop()


async def rounds_until(harness: Harness, condition: Any, timeout: float = 15) -> None:
    """Run manager rounds until `condition()` holds (deadlines and idle limits are wall-clock facts)."""

    async def done() -> bool:
        await harness.round()
        return bool(condition())

    await async_wait_until(done, timeout=timeout, what="the manager to act")


async def queue_row(db: Database, job_id: str) -> dict[str, Any]:
    async with db.read() as conn:
        row = (await conn.execute(select(dispatch_queue).where(dispatch_queue.c.job_id == job_id))).one()
        job = (await conn.execute(select(jobs.c.status, jobs.c.reason).where(jobs.c.id == job_id))).one()
    return {**row._mapping, "job_status": job.status, "job_reason": job.reason}


async def spawn_rows(db: Database) -> list[dict[str, Any]]:
    async with db.read() as conn:
        return [dict(r._mapping) for r in await conn.execute(select(scaler_spawns))]


async def history(db: Database) -> list[dict[str, Any]]:
    async with db.read() as conn:
        return [dict(r._mapping) for r in await conn.execute(select(scaler_spawn_history))]


async def test_a_spawn_is_bound_to_the_job_with_a_single_use_token(harness: Harness) -> None:
    manager = await harness.start()
    job_id = await queue_job(harness.db, "linux")
    await harness.round()
    backend = harness.backend()
    (request,) = backend.spawned
    assert request.context.bound_job_id == job_id
    assert request.labels == ("conveyor:arch:x86_64", "conveyor:os:linux", "linux")
    env = request.env
    assert env["CONVEYOR_AGENT_ID"] == request.agent_id and env["CONVEYOR_AGENT_LABELS"] == "linux"
    assert env["CONVEYOR_AGENT_EPHEMERAL"] == "1" and env["CONVEYOR_AGENT_URL"] == "ws://127.0.0.1:9/ws"
    assert env["FROM_SET"] == "1" and env["CONVEYOR_AGENT_TOKEN"] == request.token
    (row,) = await spawn_rows(harness.db)
    assert (row["agent_id"], row["state"], row["bound_job_id"], row["node_id"], row["boot_id"]) == (
        request.agent_id,
        "spawning",
        job_id,
        NODE,
        BOOT,
    )
    assert row["backend_ref"] == "ref-1"
    queued = await queue_row(harness.db, job_id)
    assert queued["bound_agent_id"] == request.agent_id
    assert queued["job_reason"] == f"waiting: agent {request.agent_id} of scaler rec is starting"
    async with harness.db.read() as conn:
        token = (await conn.execute(select(agent_tokens).where(agent_tokens.c.id == row["token_id"]))).one()
    assert (token.kind, token.single_use, token.agent_id, token.labels) == (
        "ephemeral",
        True,
        request.agent_id,
        ["linux"],
    )
    # A second round does not spawn again for the same job.
    await harness.round()
    assert len(backend.spawned) == 1

    # Registration: the token works once, the manager hands back the bound job.
    async with harness.db.transaction() as conn:
        first = await agent_store.authenticate_agent_token(conn, request.token, utc_now())
    assert not isinstance(first, AgentAuthRefusal)
    async with harness.db.transaction() as conn:
        second = await agent_store.authenticate_agent_token(conn, request.token, utc_now())
    assert isinstance(second, AgentAuthRefusal) and second.reason == "consumed"
    backend.events[request.agent_id](ScalerEvent(request.agent_id, "connecting", "agent process 42 started"))
    assert await manager.agent_registered(request.agent_id) == job_id
    assert backend.registered == [request.agent_id]
    async with harness.db.read() as conn:
        timeline_rows = list(
            await conn.execute(
                select(run_timeline.c.kind, run_timeline.c.detail)
                .where(run_timeline.c.job_id == job_id)
                .order_by(run_timeline.c.id)
            )
        )
    scaler_rows = [(kind, detail["detail"]) for kind, detail in timeline_rows if kind.startswith("scaler.")]
    assert scaler_rows == [
        ("scaler.connecting", "agent process 42 started"),
        ("scaler.ready", "agent registered"),
    ]
    assert (await spawn_rows(harness.db))[0]["state"] == "registered"

    # Single use: any disconnect ends it.
    manager.agent_disconnected(request.agent_id)
    await harness.settle()
    assert backend.destroyed == [(request.agent_id, "agent disconnected")]
    assert await spawn_rows(harness.db) == []
    (ended,) = await history(harness.db)
    assert (ended["outcome"], ended["error"]) == ("registered", None)
    async with harness.db.read() as conn:
        revoked = (
            await conn.execute(select(agent_tokens.c.revoked_at).where(agent_tokens.c.id == row["token_id"]))
        ).one()
    assert revoked.revoked_at is not None
    assert (await queue_row(harness.db, job_id))["bound_agent_id"] is None


async def test_a_free_connected_agent_is_used_instead(harness: Harness) -> None:
    await harness.start()
    await queue_job(harness.db, "linux")
    harness.connected["static"] = FakeAgent("static", ("linux",))
    await harness.round()
    assert harness.backend().spawned == []
    harness.connected["static"].jobs.add("other")
    await harness.round()
    assert len(harness.backend().spawned) == 1


async def test_global_capacity_refuses_then_redrives_when_freed(harness: Harness) -> None:
    manager = await harness.start(config_text(global_max_agents=1))
    first = await queue_job(harness.db, "linux")
    second = await queue_job(harness.db, "linux")
    await harness.round()
    backend = harness.backend()
    assert [r.context.bound_job_id for r in backend.spawned] == [first]
    refused = await queue_row(harness.db, second)
    assert refused["job_reason"] == "waiting: all scalers of this node at capacity (global_max_agents 1)"
    await manager.agent_registered(backend.spawned[0].agent_id)
    async with harness.db.transaction() as conn:  # the agent claims its job
        await conn.execute(
            update(dispatch_queue).where(dispatch_queue.c.job_id == first).values(state="claimed")
        )
    await harness.round()
    assert len(backend.spawned) == 1  # still at capacity
    manager.agent_disconnected(backend.spawned[0].agent_id)
    await harness.settle()
    await harness.round()
    assert [r.context.bound_job_id for r in backend.spawned] == [first, second]


async def test_scaler_capacity_and_resource_caps(harness: Harness) -> None:
    text = config_text(
        scaler={
            "max_agents": 2,
            "resource_cap": {"cpus": 3},
            "label_sets": [{"labels": ["linux"], "resources": {"cpus": 2}}],
        }
    )
    manager = await harness.start(text)
    for _ in range(3):
        await queue_job(harness.db, "linux")
    await harness.round()
    assert len(harness.backend().spawned) == 1  # a second 2-cpu agent would pass the 3-cpu cap
    (status,) = manager.status()
    assert (status["active"], status["cpus_used"]) == (1, 2.0)


async def test_a_spawn_that_never_registers_is_reaped(harness: Harness) -> None:
    harness.knobs["scaler_spawn_timeout_ms"] = 200
    await harness.start()
    job_id = await queue_job(harness.db, "linux")
    await harness.round()
    (request,) = harness.backend().spawned
    assert harness.backend().destroyed == []  # not before its deadline
    await rounds_until(
        harness,
        lambda: (request.agent_id, "agent did not register within 0.2 s") in harness.backend().destroyed,
    )
    (ended,) = await history(harness.db)
    assert (ended["outcome"], ended["error"], ended["log_tail"]) == (
        "timed_out",
        "agent did not register within 0.2 s",
        ["tail of " + request.agent_id],
    )
    queued = await queue_row(harness.db, job_id)
    assert queued["job_status"] == "queued" and queued["state"] == "pending"
    assert queued["last_provisioning_error"] == "agent did not register within 0.2 s"
    assert "provision backoff" in queued["job_reason"] and "did not register" in queued["job_reason"]
    async with harness.db.read() as conn:
        kinds = [
            r.kind
            for r in await conn.execute(select(run_timeline.c.kind).where(run_timeline.c.job_id == job_id))
        ]
    assert "scaler.failed" in kinds


async def test_provision_backoff_doubles_and_one_registration_resets_it(harness: Harness) -> None:
    manager = await harness.start()
    backend = harness.backend()
    backend.mode = "raise"
    job_id = await queue_job(harness.db, "linux")
    runtime = manager.scalers["rec"]
    waits = []
    for _ in range(4):
        await harness.round()
        await harness.settle()
        waits.append(runtime.backoff_ms)
        assert runtime.next_attempt_at > time.time()  # in the window now
        runtime.next_attempt_at = time.time() - 1  # the window ends
    assert waits == [1000, 2000, 3000, 3000]
    assert runtime.failures == 4
    (status,) = manager.status()
    assert status["state"] == "failing"  # from scaler_provision_max_consecutive_failures (3) on
    assert status["backoff"]["last_error"] == "repeated failure (4 in a row): exec /opt/agent: no such file"
    # In the window no spawn is tried and the job says why.
    runtime.next_attempt_at = time.time() + 60
    await harness.round()
    assert len(backend.spawned) == 4
    queued = await queue_row(harness.db, job_id)
    assert "in provision backoff until" in queued["job_reason"]
    assert "repeated failure (4 in a row): exec /opt/agent: no such file" in queued["job_reason"]
    assert queued["last_provisioning_error"] == "repeated failure (4 in a row): exec /opt/agent: no such file"
    (shown,) = manager.status()
    assert shown["backoff"]["state"] == "backoff" and shown["backoff"]["next_attempt_at"] is not None
    failed = await history(harness.db)
    assert [h["outcome"] for h in failed] == ["failed"] * 4 and failed[0]["log_tail"] == ["line 1", "line 2"]
    # A successful registration resets the count.
    backend.mode = "start"
    runtime.next_attempt_at = 0
    await harness.round()
    await manager.agent_registered(backend.spawned[-1].agent_id)
    assert (runtime.failures, runtime.next_attempt_at) == (0, 0.0)
    assert manager.status()[0]["state"] == "active"
    assert (await queue_row(harness.db, job_id))["last_provisioning_error"] is None


async def test_an_exit_after_registration_counts_nothing(harness: Harness) -> None:
    manager = await harness.start()
    await queue_job(harness.db, "linux")
    await harness.round()
    backend = harness.backend()
    (request,) = backend.spawned
    await manager.agent_registered(request.agent_id)
    backend.events[request.agent_id](
        ScalerEvent(request.agent_id, "exited", "agent exited with code 1", exit_code=1)
    )
    await harness.settle()
    runtime = manager.scalers["rec"]
    assert (runtime.failures, runtime.next_attempt_at, runtime.last_error) == (0, 0.0, None)
    (ended,) = await history(harness.db)
    assert ended["outcome"] == "registered"


async def test_an_agent_being_torn_down_counts_as_active_until_it_is_gone(harness: Harness) -> None:
    manager = await harness.start()
    await queue_job(harness.db, "linux")
    await harness.round()
    backend = harness.backend()
    (request,) = backend.spawned
    await manager.agent_registered(request.agent_id)
    backend.destroy_gate = asyncio.Event()
    backend.events[request.agent_id](
        ScalerEvent(request.agent_id, "exited", "agent exited with code 0", exit_code=0)
    )

    async def destroying() -> bool:
        return bool(backend.destroyed)

    await async_wait_until(destroying, timeout=10, what="the teardown to begin")
    # The process may still be alive (SIGTERM grace): `active` says so until the teardown ends.
    (status,) = manager.status()
    assert status["active"] == 1
    backend.destroy_gate.set()
    await harness.settle()
    (status,) = manager.status()
    assert status["active"] == 0 and request.agent_id not in backend.agents


async def test_an_exit_before_registration_is_a_provisioning_failure(harness: Harness) -> None:
    manager = await harness.start()
    job_id = await queue_job(harness.db, "linux")
    await harness.round()
    backend = harness.backend()
    (request,) = backend.spawned
    backend.events[request.agent_id](
        ScalerEvent(
            request.agent_id,
            "failed",
            "agent exited with code 2 before registering",
            exit_code=2,
            log_tail=("boom",),
        )
    )
    await harness.settle()
    assert manager.scalers["rec"].failures == 1
    queued = await queue_row(harness.db, job_id)
    assert queued["last_provisioning_error"] == "agent exited with code 2 before registering"
    assert queued["bound_agent_id"] is None


async def test_an_unclaimed_registered_agent_is_ended_when_idle(harness: Harness) -> None:
    manager = await harness.start()
    job_id = await queue_job(harness.db, "linux")
    await harness.round()
    (request,) = harness.backend().spawned
    async with harness.db.transaction() as conn:  # someone else took the job meanwhile
        await conn.execute(
            update(dispatch_queue).where(dispatch_queue.c.job_id == job_id).values(state="claimed")
        )
    assert await manager.agent_registered(request.agent_id) is None
    harness.connected[request.agent_id] = FakeAgent(request.agent_id, request.labels)
    await harness.round()
    assert harness.backend().destroyed == []  # not idle long enough yet (unclaimed_idle_s is 1 s here)
    await rounds_until(harness, lambda: bool(harness.backend().destroyed))
    assert harness.backend().destroyed == [(request.agent_id, "idle for 1 s")]


async def test_mandatory_labels_and_unschedulable_jobs(harness: Harness) -> None:
    text = config_text(
        more=[
            {
                "name": "gpu",
                "type": "recording",
                "max_agents": 1,
                "mandatory_labels": ["gpu"],
                "label_sets": [{"labels": ["linux", "gpu"]}],
            }
        ]
    )
    manager = await harness.start(text)
    plain = await queue_job(harness.db, "linux")
    wants_gpu = await queue_job(harness.db, "linux", "gpu")
    arm = await queue_job(harness.db, "arm9")
    await harness.round()
    assert [r.context.bound_job_id for r in harness.backend("rec").spawned] == [plain]
    assert [r.context.bound_job_id for r in harness.backend("gpu").spawned] == [wants_gpu]
    # The unschedulable rule asks the scaler: served jobs wait, the [arm9] one is unschedulable.
    grace_ms = 0

    async def grace() -> int:
        return grace_ms

    settings = SweepSettings(unroutable_grace_ms=grace, scalable=manager.wait_note)
    async with harness.db.transaction() as conn:
        await conn.execute(
            update(dispatch_queue).where(dispatch_queue.c.job_id == plain).values(bound_agent_id=None)
        )
        results = await classify_queue(conn, settings, utc_now())
    assert len(results) == 1  # only [arm9] failed unroutable (zero grace)
    assert (await queue_row(harness.db, plain))["job_reason"].startswith("waiting: agent ")
    async with harness.db.read() as conn:
        arm_job = (await conn.execute(select(jobs.c.status, jobs.c.reason).where(jobs.c.id == arm))).one()
    assert arm_job.status == "failed" and arm_job.reason.startswith(
        "unroutable: no connected agent or scaler matches [arm9]"
    )


async def test_reload_is_all_or_nothing(harness: Harness) -> None:
    manager = await harness.start()
    # One valid change and one label set served twice: nothing is applied.
    bad = config_text(
        scaler={"max_agents": 9},
        more=[{"name": "dup", "type": "recording", "max_agents": 1, "label_sets": [{"labels": ["linux"]}]}],
    )
    harness.path.write_text(bad)
    with pytest.raises(ScalerConfigError) as caught:
        await manager.reload()
    assert any("label set [linux] is also served by scaler rec" in p for p in caught.value.problems)
    assert manager.scalers["rec"].entry.max_agents == 4 and "dup" not in manager.scalers
    assert manager.reloads == {"applied": 0, "failed": 1}
    # A type change is refused by name.
    harness.path.write_text(config_text().replace("type: recording", "type: other"))
    with pytest.raises(ScalerConfigError):
        await manager.reload()
    # A valid file applies: changed limits, a new scaler, and the removed one retires.
    good = config_text(
        scaler={"name": "renamed", "max_agents": 9},
    )
    harness.path.write_text(good)
    job_id = await queue_job(harness.db, "linux")
    await harness.round()
    old_agent = harness.backend("rec").spawned[0].agent_id
    result = await manager.reload()
    assert result == {"applied": True, "scalers": ["renamed"]}
    assert manager.scalers["rec"].retiring and manager.scalers["renamed"].entry.max_agents == 9
    assert [s["state"] for s in manager.status()] == ["active", "retiring"]
    await manager.agent_registered(old_agent)
    manager.agent_disconnected(old_agent)
    await harness.settle()
    await harness.round()
    assert "rec" not in manager.scalers  # removed once empty
    assert manager.reloads == {"applied": 1, "failed": 2}
    assert job_id


async def test_concurrent_reloads_are_refused(harness: Harness) -> None:
    manager = await harness.start()
    async with manager._reload_lock:
        with pytest.raises(ReloadInProgress):
            await manager.reload()


async def test_warm_pools_fill_are_used_and_replaced(harness: Harness) -> None:
    text = config_text(scaler={"warm_pool": {"size": 2, "idle_timeout_s": 0.3}})
    manager = await harness.start(text)
    await harness.round()
    backend = harness.backend()
    assert [r.context.warm for r in backend.spawned] == [True, True]
    assert all(r.context.bound_job_id is None for r in backend.spawned)
    for request in backend.spawned:
        assert await manager.agent_registered(request.agent_id) is None
        harness.connected[request.agent_id] = FakeAgent(request.agent_id, request.labels)
    await harness.round()
    assert len(backend.spawned) == 2
    (status,) = manager.status()
    assert (status["warm_idle"], status["warm_target"]) == (2, 2)
    # A queued job goes to an idle warm agent (the dispatcher's job), so no spawn for it.
    await queue_job(harness.db, "linux")
    await harness.round()
    assert len(backend.spawned) == 2
    # Once one takes a job, the pool refills to 2 idle.
    harness.connected[backend.spawned[0].agent_id].jobs.add("some-job")
    await harness.round()
    assert len(backend.spawned) == 3 and backend.spawned[2].context.warm
    # Idle longer than idle_timeout_s: destroyed and replaced.
    await rounds_until(
        harness, lambda: (backend.spawned[1].agent_id, "warm agent idle timeout") in backend.destroyed
    )
    assert (backend.spawned[0].agent_id, "warm agent idle timeout") not in backend.destroyed  # it took a job


async def test_no_warm_spawn_while_a_job_waits_for_capacity(harness: Harness) -> None:
    text = config_text(scaler={"max_agents": 1, "warm_pool": {"size": 1}})
    await harness.start(text)
    await queue_job(harness.db, "linux")
    await queue_job(harness.db, "linux")
    await harness.round()
    backend = harness.backend()
    assert [r.context.warm for r in backend.spawned] == [False]


async def test_leftovers_of_an_older_boot_are_ended_at_start(harness: Harness) -> None:
    async with harness.db.transaction() as conn:
        plaintext, token = await agent_store.mint_agent_token(
            conn,
            labels=["linux"],
            mandatory_labels=[],
            label=None,
            created_by="scaler:rec",
            kind="ephemeral",
            single_use=True,
        )
        old_token_id = token.id
        now = utc_now()
        for agent_id, node, boot in (("old-agent", NODE, "boot-1"), ("peer-agent", "node-9", "boot-x")):
            await conn.execute(
                insert(scaler_spawns).values(
                    agent_id=agent_id,
                    node_id=node,
                    boot_id=boot,
                    scaler="rec",
                    backend_type="recording",
                    label_set=["linux"],
                    state="registered",
                    token_id=old_token_id if agent_id == "old-agent" else None,
                    spawned_at=now,
                    deadline_at=now + timedelta(minutes=5),
                )
            )
    assert plaintext
    RecordingBackend.instances.clear()
    harness.path.write_text(config_text())
    manager = await harness.start()
    # end_leftovers ran in start() before the backend's live list was set; run it again with items.
    backend = harness.backend()
    backend.live = [
        LiveItem(
            "old-agent",
            "process",
            "recording",
            "1",
            agent_id="old-agent",
            node_marker=NODE,
            boot_marker="boot-1",
        ),
        LiveItem(
            "mine-now", "process", "recording", "2", agent_id="mine-now", node_marker=NODE, boot_marker=BOOT
        ),
        LiveItem(
            "peer-agent",
            "process",
            "recording",
            "3",
            agent_id="peer-agent",
            node_marker="node-9",
            boot_marker="b",
        ),
    ]
    assert await manager.end_leftovers() == ["old-agent"]
    assert backend.stopped == ["old-agent"]
    ended = {row["agent_id"]: row["outcome"] for row in await history(harness.db)}
    assert ended == {"old-agent": "node_restarted"}
    assert [row["agent_id"] for row in await spawn_rows(harness.db)] == ["peer-agent"]
    async with harness.db.read() as conn:
        revoked = (
            await conn.execute(select(agent_tokens.c.revoked_at).where(agent_tokens.c.id == old_token_id))
        ).one()
    assert revoked.revoked_at is not None


async def test_stop_tears_down_every_agent(harness: Harness) -> None:
    manager = await harness.start()
    await queue_job(harness.db, "linux")
    await harness.round()
    (request,) = harness.backend().spawned
    await manager.stop()
    harness.manager = None
    assert [a for a, _ in RecordingBackend.instances[0].destroyed] == [request.agent_id]
    assert await spawn_rows(harness.db) == []


async def test_stop_lets_a_teardown_under_way_finish_instead_of_cancelling_it(harness: Harness) -> None:
    # The one-shot agent of a finished job disconnects: its teardown (SIGTERM, then the wait for its exit)
    # runs in the background when the orchestrator stops. Cancelled, it would leave the agent running.
    manager = await harness.start()
    await queue_job(harness.db, "linux")
    await harness.round()
    backend = harness.backend()
    (request,) = backend.spawned
    await manager.agent_registered(request.agent_id)
    backend.destroy_gate = asyncio.Event()
    manager.agent_disconnected(request.agent_id)

    async def destroying() -> bool:
        return bool(backend.destroyed)

    await async_wait_until(destroying, timeout=10, what="the teardown to begin")
    stopping = asyncio.create_task(manager.stop())
    harness.manager = None
    backend.destroy_gate.set()
    await asyncio.wait_for(stopping, timeout=10)
    assert request.agent_id not in backend.agents  # the teardown ran to its end
    assert await spawn_rows(harness.db) == []


async def test_one_spawn_per_job_across_coordinators(harness: Harness) -> None:
    manager = await harness.start()
    served = await queue_job(harness.db, "linux")
    stale = await queue_job(harness.db, "linux")
    now = utc_now()
    async with harness.db.transaction() as conn:
        # Another coordinator's spawn is on its way for `served`; `stale` names a spawn that no longer exists.
        await conn.execute(
            insert(scaler_spawns).values(
                agent_id="peer-spawn",
                node_id="node-9",
                boot_id="b",
                scaler="rec",
                backend_type="recording",
                label_set=["linux"],
                bound_job_id=served,
                state="spawning",
                spawned_at=now,
                deadline_at=now + timedelta(minutes=5),
            )
        )
        await conn.execute(
            update(dispatch_queue)
            .where(dispatch_queue.c.job_id == served)
            .values(bound_agent_id="peer-spawn")
        )
        await conn.execute(
            update(dispatch_queue).where(dispatch_queue.c.job_id == stale).values(bound_agent_id="gone-spawn")
        )
    await harness.round()
    (request,) = harness.backend().spawned
    assert request.context.bound_job_id == stale
    assert (await queue_row(harness.db, served))["bound_agent_id"] == "peer-spawn"
    assert (await queue_row(harness.db, stale))["bound_agent_id"] == request.agent_id
    # The compare-and-swap itself: a second binder of the same row loses.
    from conveyor.scaler import store

    async with harness.db.transaction() as conn:
        assert not await store.claim_binding(conn, stale, "late-spawn", None)
        assert not await store.claim_binding(conn, stale, "late-spawn", "gone-spawn")
    assert (await queue_row(harness.db, stale))["bound_agent_id"] == request.agent_id
    assert manager.spawns.keys() == {request.agent_id}


async def test_metrics_follow_spawns_failures_refusals_and_reloads(harness: Harness) -> None:
    from prometheus_client import generate_latest

    manager = await harness.start(config_text(global_max_agents=1))
    manager.metrics.watch(manager)
    await queue_job(harness.db, "linux")
    await queue_job(harness.db, "linux")
    await harness.round()
    (request,) = harness.backend().spawned
    await manager.agent_registered(request.agent_id)
    # The second job is refused again on every round; the refusal is counted once.
    await harness.round()
    await harness.round()
    harness.backend().mode = "raise"
    harness.path.write_text("version: 2\n")
    with pytest.raises(ScalerConfigError):
        await manager.reload()
    text = generate_latest(manager.metrics.registry).decode()
    assert 'conveyor_scaler_spawns_total{outcome="registered",scaler="rec"} 1.0' in text
    assert 'conveyor_scaler_spawn_refusals_total{reason="at_capacity",scaler="rec"} 1.0' in text
    assert 'conveyor_scaler_agents{scaler="rec",state="running",warm="false"} 1.0' in text
    assert 'conveyor_scaler_config_reloads_total{result="failed"} 1.0' in text
    assert 'conveyor_scaler_spawn_to_register_seconds_count{scaler="rec"} 1.0' in text
    assert 'conveyor_scaler_cpus_used{scaler="__global__"} 0.0' in text
    manager.agent_disconnected(request.agent_id)
    await harness.settle()
    await harness.round()  # the second job: its spawn fails
    text = generate_latest(manager.metrics.registry).decode()
    assert 'conveyor_scaler_spawn_failures_total{bound="true",scaler="rec"} 1.0' in text
    assert 'conveyor_scaler_spawns_total{outcome="failed",scaler="rec"} 1.0' in text
    assert 'conveyor_scaler_consecutive_failures{scaler="rec"} 1.0' in text


async def test_the_reaper_closes_rows_of_this_boot_that_no_spawn_holds(harness: Harness) -> None:
    manager = await harness.start()
    await queue_job(harness.db, "linux")
    await harness.round()
    (request,) = harness.backend().spawned
    now = utc_now()
    async with harness.db.transaction() as conn:
        await conn.execute(
            insert(scaler_spawns).values(
                agent_id="lost-spawn",
                node_id=NODE,
                boot_id=BOOT,
                scaler="rec",
                backend_type="recording",
                label_set=["linux"],
                state="spawning",
                spawned_at=now,
                deadline_at=now + timedelta(minutes=5),
            )
        )
    await harness.round()
    assert {row["agent_id"] for row in await spawn_rows(harness.db)} == {"lost-spawn", request.agent_id}
    harness.knobs["scaler_reap_interval_ms"] = 0
    await harness.round()
    assert [row["agent_id"] for row in await spawn_rows(harness.db)] == [request.agent_id]
    assert [(h["agent_id"], h["outcome"]) for h in await history(harness.db)] == [("lost-spawn", "failed")]
    assert manager.spawns.keys() == {request.agent_id}


async def test_a_connected_spawned_agent_serves_its_bound_job_and_no_other(harness: Harness) -> None:
    await harness.start()
    bound_job = await queue_job(harness.db, "linux")
    other = await queue_job(harness.db, "linux")
    harness.connected["spawned"] = FakeAgent("spawned", ("linux",), bound=bound_job)
    await harness.round()
    # It serves its bound job; the other job gets a spawn of its own.
    assert [r.context.bound_job_id for r in harness.backend().spawned] == [other]
    harness.backend().spawned.clear()
    third = await queue_job(harness.db, "linux")
    async with harness.db.transaction() as conn:  # its bound job went elsewhere
        await conn.execute(
            update(dispatch_queue).where(dispatch_queue.c.job_id == bound_job).values(state="claimed")
        )
    await harness.round()
    # It is still sent no other job (docs/design/execution.md §5, "Single use"): the third gets its own spawn.
    assert [r.context.bound_job_id for r in harness.backend().spawned] == [third]


async def test_a_spawned_agents_token_lives_agent_token_ttl_ms(harness: Harness) -> None:
    harness.knobs["agent_token_ttl_ms"] = 2 * 3_600_000
    await harness.start()
    await queue_job(harness.db, "linux")
    await harness.round()
    harness.knobs["agent_token_ttl_ms"] = 3 * 3_600_000  # read live: the next spawn uses it
    await queue_job(harness.db, "linux")
    await harness.round()
    lifetimes = []
    for row in sorted(await spawn_rows(harness.db), key=lambda r: r["spawned_at"]):
        async with harness.db.read() as conn:
            token = (
                await conn.execute(select(agent_tokens).where(agent_tokens.c.id == row["token_id"]))
            ).one()
        lifetimes.append(round((token.expires_at - token.created_at).total_seconds()))
    assert lifetimes == [7200, 10800]


async def test_a_failed_teardown_is_tried_again_every_reattempt_interval_until_it_succeeds(
    harness: Harness,
) -> None:
    harness.knobs["scaler_reap_reattempt_interval_ms"] = 5000
    manager = await harness.start()
    job_id = await queue_job(harness.db, "linux")
    await harness.round()
    backend = harness.backend()
    (request,) = backend.spawned
    await manager.agent_registered(request.agent_id)
    backend.failing_destroys = 2  # the first teardown and its first reattempt fail
    manager.agent_disconnected(request.agent_id)
    await harness.settle()

    def attempts() -> int:
        return [agent_id for agent_id, _ in backend.destroyed].count(request.agent_id)

    # The record is closed at the first attempt (token revoked, job freed); the compute is still there.
    assert attempts() == 1 and request.agent_id in backend.agents
    assert await spawn_rows(harness.db) == []
    assert [(h["agent_id"], h["outcome"]) for h in await history(harness.db)] == [
        (request.agent_id, "registered")
    ]
    assert (await queue_row(harness.db, job_id))["bound_agent_id"] is None
    # Rounds before the interval try nothing; at the interval one attempt, which fails and starts a new wait.
    cadence = []
    for now in (1.0, 4.999, 5.0, 6.0, 9.999, 10.0, 20.0, 60.0):
        harness.now = now
        await harness.round()
        cadence.append((now, attempts()))
    assert cadence == [(1.0, 1), (4.999, 1), (5.0, 2), (6.0, 2), (9.999, 2), (10.0, 3), (20.0, 3), (60.0, 3)]
    assert request.agent_id not in backend.agents and manager.failed_teardowns == {}


async def test_the_reattempt_interval_is_read_live_and_stop_makes_a_last_attempt(harness: Harness) -> None:
    manager = await harness.start()
    await queue_job(harness.db, "linux")
    await harness.round()
    backend = harness.backend()
    (request,) = backend.spawned
    backend.failing_destroys = 2
    await manager._end(manager.spawns[request.agent_id], reason="idle")

    def attempts() -> int:
        return [agent_id for agent_id, _ in backend.destroyed].count(request.agent_id)

    harness.now = 1.0
    await harness.round()
    assert attempts() == 1  # the interval is 30 s
    harness.knobs["scaler_reap_reattempt_interval_ms"] = 1000
    await harness.round()
    assert attempts() == 2  # the new interval, at the next round
    await manager.stop()
    harness.manager = None
    assert attempts() == 3 and request.agent_id not in backend.agents
