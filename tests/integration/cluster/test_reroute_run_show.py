"""`GET runs/{id}` names each reroute of a job: its worker, hop, the workers tried and why each offer ended."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from conveyor.cluster.messages import JobRerouteAck
from conveyor.cluster.reroute import RerouteService
from conveyor.cluster.routes import PEER_HUB
from conveyor.db.engine import Database
from tests.support.inprocess import InProcessServer, in_process_server
from tests.support.queued import queue_job
from tests.support.reroute import (
    Peers,
    give_back,
    job_row,
    nak,
    offered_through,
    offers,
    reroute_service,
    seen,
)

WORKERS = ("w1", "w2")


@pytest.fixture
async def server(database_url: str, tmp_path: Path) -> AsyncIterator[InProcessServer]:
    """The real app; its peer registry counts w1 and w2 as connected, so its sweep leaves their jobs alone."""
    async with in_process_server(database_url, tmp_path / "home") as running:
        for worker in WORKERS:
            running.state.parts.need(PEER_HUB).registry.connected(worker, "worker")
        yield running


@pytest.fixture
async def service(server: InProcessServer) -> AsyncIterator[tuple[RerouteService, Peers, Database]]:
    """A coordinator's reroute service on the server's database, with both workers seen."""
    peers = Peers(*WORKERS)
    reroute = reroute_service(server.state.db, peers)
    seen(reroute, "w1", slots=2)
    seen(reroute, "w2", slots=1)
    try:
        yield reroute, peers, server.state.db
    finally:
        await reroute.stop()


async def shown_job(server: InProcessServer, db: Database, job_id: str) -> dict[str, Any]:
    run_id = (await job_row(db, job_id)).run_id
    answer = await server.client.get(f"/api/v1/admin/runs/{run_id}", headers=server.auth())
    assert answer.status_code == 200, answer.text
    listed = await server.client.get(f"/api/v1/admin/runs/{run_id}/jobs", headers=server.auth())
    (job,) = answer.json()["jobs"]
    assert listed.json()["items"][0]["reroutes"] == job["reroutes"]
    return job  # type: ignore[no-any-return]


def summary(job: dict[str, Any]) -> list[tuple[Any, ...]]:
    return [(r["worker"], r["hop"], r["outcome"], r["reason"]) for r in job["reroutes"]]


async def accept(reroute: RerouteService, peers: Peers, worker: str) -> None:
    (offer,) = offers(peers, worker)
    await reroute.on_ack(
        worker, JobRerouteAck(message_id=offer["message_id"], job_id=offer["job_id"], accepted=True)
    )


async def test_a_job_on_its_second_worker_names_the_hop_and_the_refusal_before_it(
    server: InProcessServer, service: tuple[RerouteService, Peers, Database]
) -> None:
    reroute, peers, db = service
    job_id = await offered_through(db, reroute, "w1")
    await nak(reroute, peers, "w1", reason="no-capacity")
    await accept(reroute, peers, "w2")

    job = await shown_job(server, db, job_id)

    assert (job["rerouted_to"], job["reroute_hop"], job["reroute_tried"]) == ("w2", 2, ["c1", "w1"])
    assert summary(job) == [("w1", 1, "rejected", "no-capacity")]
    assert job["reroutes"][0]["detail"] == "worker w1: no-capacity"


async def test_a_job_given_back_by_its_last_worker_names_every_worker_and_the_re_dispatch_reason(
    server: InProcessServer, service: tuple[RerouteService, Peers, Database]
) -> None:
    reroute, peers, db = service
    job_id = await offered_through(db, reroute, "w1")
    await nak(reroute, peers, "w1", reason="draining")
    await accept(reroute, peers, "w2")
    await reroute.on_scaler_event("w2", give_back(job_id))  # no worker left: back to local capacity

    job = await shown_job(server, db, job_id)

    assert job["rerouted_to"] is None and job["reroute_tried"] == ["c1", "w1", "w2"]
    assert summary(job) == [("w1", 1, "rejected", "draining"), ("w2", 2, "taken_back", "final")]
    assert job["reroutes"][1]["detail"].startswith("worker w2: gave the job back: spawn failed")


async def test_a_job_never_rerouted_has_no_reroutes(
    server: InProcessServer, service: tuple[RerouteService, Peers, Database]
) -> None:
    _, _, db = service
    job_id = await queue_job(db, "linux")
    job = await shown_job(server, db, job_id)
    assert job["reroutes"] == [] and job["rerouted_to"] is None
