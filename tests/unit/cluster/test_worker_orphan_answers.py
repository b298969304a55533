"""A worker answers its coordinators' `peer.scaler.orphans.request` from memory (docs/design/scaler.md §7)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from conveyor.cluster.messages import OrphansRequest
from conveyor.cluster.orphans import COORDINATORS_ONLY, install_orphan_answers, worker_facts
from conveyor.scaler.backend import LiveItem
from conveyor.scaler.orphans import Facts, Orphans

WORKER = "w1"


def live(agent_id: str, node: str) -> LiveItem:
    return LiveItem(
        vm_id=f"vm-{agent_id}",
        kind="process",
        backend="bare-metal",
        backend_ref="1",
        agent_id=agent_id,
        node_marker=node,
    )


class Manager:
    """The scaler manager's side: live items and stopping one."""

    def __init__(self, *items: LiveItem) -> None:
        self.items = list(items)
        self.spawns: dict[str, Any] = {}
        self.stopped: list[str] = []

    async def live_items(self) -> list[tuple[None, LiveItem]]:
        return [(None, item) for item in self.items]

    async def stop_item(self, backend: None, item: LiveItem) -> None:
        self.stopped.append(item.vm_id)


def answering_worker(manager: Manager) -> Any:
    """The handler a worker installs, with one held job running on agent `busy`."""
    handlers: dict[str, Any] = {}
    hub = SimpleNamespace(
        identity=SimpleNamespace(instance_id=WORKER),
        handle=lambda kind, handler: handlers.__setitem__(kind, handler),
    )

    async def facts() -> Facts:
        return worker_facts(
            WORKER,
            spawn_ids=list(manager.spawns),
            held_jobs=[("job-1", "busy", None)],
            agents=[],
            peers=[("c1", "coordinator", True)],
        )

    orphans = Orphans(manager, WORKER, facts)
    install_orphan_answers(hub, lambda: orphans)  # type: ignore[arg-type]
    return handlers["peer.scaler.orphans.request"]


def session(role: str) -> Any:
    return SimpleNamespace(peer_role=role, peer_id="c1" if role == "coordinator" else "w9")


async def test_a_worker_lists_its_leftovers_and_the_agent_of_a_held_job_as_tracked() -> None:
    answer = answering_worker(Manager(live("stray", "gone-node"), live("busy", WORKER)))
    reply = await answer(session("coordinator"), OrphansRequest(message_id="m1", action="list"))
    assert reply.ok and reply.node == WORKER and reply.complete is True
    states = {item["agent_id"]: (item["state"], item["tracked_by"], item["job_id"]) for item in reply.items}
    assert states == {"stray": ("untracked", [], None), "busy": ("tracked", ["job"], "job-1")}


async def test_a_worker_stops_a_leftover_and_refuses_the_agent_of_a_held_job() -> None:
    manager = Manager(live("stray", "gone-node"), live("busy", WORKER))
    answer = answering_worker(manager)
    request = OrphansRequest(message_id="m2", action="stop", vm_ids=["vm-stray", "vm-busy"])
    reply = await answer(session("coordinator"), request)
    assert [(r["vm_id"], r["outcome"]) for r in reply.results] == [
        ("vm-stray", "stopped"),
        ("vm-busy", "tracked"),
    ]
    assert manager.stopped == ["vm-stray"]


async def test_a_worker_answers_no_peer_but_a_coordinator() -> None:
    manager = Manager(live("stray", "gone-node"))
    answer = answering_worker(manager)
    reply = await answer(
        session("worker"), OrphansRequest(message_id="m3", action="stop", vm_ids=["vm-stray"])
    )
    assert (reply.ok, reply.error, reply.results) == (False, COORDINATORS_ONLY, None)
    assert manager.stopped == []
