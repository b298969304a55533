"""A reroute service on an in-process server with stand-in peers (`Peers`, recording what was sent), and the rows of a rerouted job."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import select

from conveyor.cluster.messages import (
    AgentInventory,
    JobRerouteAck,
    ScalerEventRelay,
)
from conveyor.cluster.reroute import (
    RerouteService,
    RerouteSettings,
    WorkerView,
    resolve_reroute_settings,
)
from conveyor.db.engine import Database
from conveyor.db.tables import jobs
from conveyor.execution.queue import claim_for
from conveyor.model import protocol as p
from conveyor.model.ids import format_rfc3339, new_id, utc_now
from tests.support.queued import queue_job
from tests.support.waiting import async_wait_until


class Session:
    def __init__(self, peer_id: str = "", peer_role: str = "worker") -> None:
        self.peer_id = peer_id
        self.peer_role = peer_role
        self.sent: list[dict[str, Any]] = []
        # A worker that answers as it reads: called with each message sent, before `send` returns.
        self.answer: Callable[[dict[str, Any]], None] | None = None

    async def send(self, message: Any) -> None:
        self.sent.append(message.wire())
        if self.answer is not None:
            self.answer(self.sent[-1])


class Peers:
    def __init__(self, *workers: str, coordinators: tuple[str, ...] = ()) -> None:
        self.sessions = {worker: Session(worker) for worker in workers}
        self.sessions.update({c: Session(c, "coordinator") for c in coordinators})

    def session_for(self, instance_id: str) -> Session | None:
        return self.sessions.get(instance_id)

    def connected(self, role: str | None = None) -> list[str]:
        return sorted(i for i, s in self.sessions.items() if role is None or s.peer_role == role)


class Dispatcher:
    def __init__(self) -> None:
        self.agents: dict[str, Any] = {}
        self.woken = 0

    def wake(self) -> None:
        self.woken += 1

    async def build_dispatch(self, claim: Any) -> p.JobDispatch:
        """What the real dispatcher rebuilds for a job taken back (rows and secrets read again)."""
        return job_dispatch(claim, {"KEY": "v2"})


LINUX = {"labels": [{"kind": "exact", "pattern": "linux", "flags": ""}], "exclude": []}


def job_dispatch(claim: Any, secrets: dict[str, str], runs_on: dict[str, Any] = LINUX) -> p.JobDispatch:
    """The `job.dispatch` of a claimed job (a `build` job of workflow `ci` at a fixed commit) with `secrets`."""
    return p.JobDispatch(
        id=new_id(),
        job_id=claim.job_id,
        run_id=claim.run_id,
        attempt=claim.attempt,
        repo=p.RepoSpec(clone_url="file:///repo", sha="abc"),
        workflow=p.WorkflowSpec(name="ci", file="ci.py", content_hash="h", hashed_files=[]),
        job={"name": "build", "runs_on": runs_on},
        secrets=secrets,
    )


STARTED: list[RerouteService] = []


# The knobs every test starts from, by name (org > cluster > default is `resolve_reroute_settings`'s
# job, tested in tests/integration/cluster/test_reroute_service.py); a test overrides one as a keyword to show what it changes.
KNOBS = {
    "reroute_ack_timeout_ms": 15_000,
    "reroute_max_hops": 3,
    "reroute_spawn_window_ms": 60_000,
    "reroute_spawn_max_attempts": 2,
    "reroute_spawn_retry_backoff_ms": 700,
}


def reroute_service(
    db: Database,
    peers: Peers,
    owner: str = "c1",
    *,
    org_overrides: dict[str, dict[str, int]] | None = None,
    **knobs: int,
) -> RerouteService:
    values = {**KNOBS, **knobs}

    async def org_value(org: str, name: str) -> int | None:
        return {**values, **(org_overrides or {}).get(org, {})}[name]

    async def settings(org: str) -> RerouteSettings:
        return await resolve_reroute_settings(org, org_value)

    async def ownership_check_timeout_ms() -> int:
        return values.get("ownership_db_check_timeout_ms", 5000)

    service = RerouteService(
        db,
        Dispatcher(),  # type: ignore[arg-type]
        peers,
        owner=lambda: owner,
        settings=settings,
        max_attempts=5,
        ownership_check_timeout_ms=ownership_check_timeout_ms,
    )
    STARTED.append(service)
    return service


async def job_row(db: Database, job_id: str) -> Any:
    async with db.read() as conn:
        return (await conn.execute(select(jobs).where(jobs.c.id == job_id))).one()


def seen(service: RerouteService, worker: str, slots: int = 1) -> None:
    """A heartbeat from `worker` with one idle `linux` agent of `slots` slots."""
    agent = AgentInventory(agent_id=f"{worker}-agent", labels=["linux"], capacity=slots)
    service.worker_seen(WorkerView(worker, True, False, (agent,), ()))


async def offered_through(db: Database, service: RerouteService, worker: str) -> str:
    """A queued `linux` job claimed by `worker`'s capacity, as the dispatcher does, then offered."""
    job_id = await queue_job(db, "linux")
    link = next(link for link in service.links.values() if link.worker == worker)
    slot = link.free_slot()
    assert slot is not None

    async def claimed() -> Any:
        # On PostgreSQL the claim skips rows another transaction holds (`SKIP LOCKED`): a server's own
        # sweep may be writing the row's wait note at this moment. The dispatcher claims again on its
        # next round; so does this.
        async with db.transaction() as conn:
            return await claim_for(conn, slot, owner="c1", now=utc_now(), ack_timeout_ms=10_000)

    claim = await async_wait_until(claimed, timeout=30, what="the job claimed for the worker's capacity")
    assert claim.job_id == job_id
    dispatch = job_dispatch(claim, {"KEY": "v"})
    assert await link.offer(dispatch)
    return job_id


def offers(peers: Peers, worker: str) -> list[dict[str, Any]]:
    return [m for m in peers.sessions[worker].sent if m["type"] == "job.reroute"]


async def nak(service: RerouteService, peers: Peers, worker: str, reason: str = "no-capacity") -> None:
    (offer,) = offers(peers, worker)[-1:]
    await service.on_ack(
        worker,
        JobRerouteAck(message_id=offer["message_id"], job_id=offer["job_id"], accepted=False, reason=reason),
    )


def give_back(job_id: str, final: bool | None = True) -> ScalerEventRelay:
    return ScalerEventRelay(
        run_id="r",
        job_id=job_id,
        kind="failed",
        detail="spawn failed",
        attempt=2,
        final=final,
        at=format_rfc3339(utc_now()),
    )
