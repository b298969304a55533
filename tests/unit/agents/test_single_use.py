"""A single-use agent is offered one job (docs/design/execution.md §5, "Single use"): the pure rule, an
agent connection's free slot and bound job as both dispatchers read them, and the worker's dispatcher."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from conveyor.agents.hub import AgentConnection
from conveyor.cluster.worker import WorkerService
from conveyor.execution.queue import ANY_ROW, NO_ROW, ClaimScope, single_use_scope
from conveyor.model import protocol as p
from tests.support.worker_units import reroute
from tests.support.worker_units import service as worker_service


class FakeSocket:
    """A fake websocket: records the frames sent (no socket exists in a unit test)."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    async def send_text(self, text: str) -> None:
        self.sent.append(json.loads(text))

    async def close(self, code: int, reason: str = "") -> None:
        pass


def connection(*, ephemeral: bool, capacity: int = 1, bound: str | None = None) -> AgentConnection:
    return AgentConnection(
        websocket=FakeSocket(),  # type: ignore[arg-type]
        agent_id="a1",
        token_id="t1",
        labels=("linux",),
        mandatory_labels=(),
        capacity=capacity,
        ephemeral=ephemeral,
        bound=bound,
    )


def dispatch(job_id: str) -> p.JobDispatch:
    return p.JobDispatch(
        id=f"d-{job_id}",
        job_id=job_id,
        run_id="r1",
        attempt=1,
        repo=p.RepoSpec(clone_url="file:///repo", ref="refs/heads/main", sha="abc"),
        workflow=p.WorkflowSpec(name="ci", file="ci.py", content_hash="h", hashed_files=[]),
        job={"name": "build"},
        secrets={"DEPLOY_KEY": "s3cr3t"},
    )


@pytest.mark.parametrize(
    ("single_use", "bound", "dispatched", "expected"),
    [
        (False, None, False, ANY_ROW),  # a reusable agent: any job its labels match, again and again
        (False, None, True, ANY_ROW),
        (True, None, False, ANY_ROW),  # warm or hand-started ephemeral: its first job may be any
        (True, None, True, NO_ROW),  # ... and after it, none
        (True, "job-a", False, ClaimScope(any_row=False, job_id="job-a")),  # a spawn's: its job only
        (True, "job-a", True, NO_ROW),  # even when that job comes back to the queue
    ],
)
def test_the_single_use_rule(
    single_use: bool, bound: str | None, dispatched: bool, expected: ClaimScope
) -> None:
    assert single_use_scope(single_use=single_use, bound_job_id=bound, dispatched=dispatched) == expected


async def test_an_ephemeral_agent_has_no_free_slot_once_sent_a_job_even_with_room_and_after_it() -> None:
    agent = connection(ephemeral=True, capacity=2)
    assert agent.free_slot() is not None and agent.bound_job_id() is None
    assert await agent.offer(dispatch("job-1"))
    assert agent.free_slot() is None  # room for a second, but single use
    agent.jobs.discard("job-1")  # its job finished (or was given back)
    assert agent.free_slot() is None


async def test_a_reusable_agent_is_free_again_once_its_job_left() -> None:
    agent = connection(ephemeral=False)
    assert await agent.offer(dispatch("job-1"))
    assert agent.free_slot() is None
    agent.jobs.discard("job-1")
    assert agent.free_slot() is not None and agent.bound_job_id() is None


async def test_a_spawned_agent_may_take_only_its_bound_job_and_only_once() -> None:
    agent = connection(ephemeral=True, bound="job-a")
    assert agent.free_slot() is not None and agent.bound_job_id() == "job-a"
    assert await agent.offer(dispatch("job-a"))
    agent.jobs.discard("job-a")  # e.g. rejected and requeued: not offered again
    assert agent.free_slot() is None and agent.bound_job_id() is None


def worker(tmp_path: Path) -> WorkerService:
    """A worker whose (inventoried) scaler has room, so it accepts the reroutes."""
    service, _ = worker_service(tmp_path, scaler_room=2)
    return service


async def test_the_worker_never_offers_a_spawned_agent_another_job(tmp_path: Path) -> None:
    service = worker(tmp_path)
    assert service.accept(reroute("job-b"), "c1").accepted
    spawned = connection(ephemeral=True, bound="job-a")  # its own job is not (or no longer) held here
    service.dispatcher.agents[spawned.agent_id] = spawned
    assert await service.dispatcher.dispatch_round() == 0
    assert spawned.websocket.sent == []  # type: ignore[attr-defined]


async def test_the_worker_never_offers_an_ephemeral_agent_a_second_job(tmp_path: Path) -> None:
    service = worker(tmp_path)
    agent = connection(ephemeral=True, capacity=2)
    service.dispatcher.agents[agent.agent_id] = agent
    for job_id in ("job-1", "job-2"):
        assert service.accept(reroute(job_id), "c1").accepted
    assert await service.dispatcher.dispatch_round() == 1
    agent.jobs.clear()  # the first job finished
    assert await service.dispatcher.dispatch_round() == 0
    assert [m["job_id"] for m in agent.websocket.sent] == ["job-1"]  # type: ignore[attr-defined]
