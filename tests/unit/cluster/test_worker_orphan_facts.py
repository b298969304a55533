"""`worker_facts`: a worker (no database) classifies its live items from memory (docs/design/scaler.md §7)."""

from conveyor.cluster.orphans import worker_facts
from conveyor.scaler.backend import LiveItem
from conveyor.scaler.orphans import classify

WORKER = "w1"


def item(agent_id: str, node: str | None = WORKER) -> LiveItem:
    return LiveItem(
        vm_id=f"vm-{agent_id}",
        kind="process",
        backend="bare-metal",
        backend_ref="1",
        agent_id=agent_id,
        node_marker=node,
    )


def test_a_leftover_no_memory_tracks_is_untracked() -> None:
    facts = worker_facts(WORKER, spawn_ids=[], held_jobs=[], agents=[], peers=[("c1", "coordinator", True)])
    assert classify(item("stray", node="gone-node"), facts).state == "untracked"


def test_an_agent_of_a_spawn_in_memory_is_tracked_by_spawn() -> None:
    facts = worker_facts(WORKER, spawn_ids=["a1"], held_jobs=[], agents=[], peers=[])
    assert classify(item("a1"), facts).tracked_by == ("spawn",)


def test_an_agent_running_or_bound_to_a_held_job_is_tracked_by_job() -> None:
    facts = worker_facts(
        WORKER,
        spawn_ids=[],
        held_jobs=[("job-1", "a1", None), ("job-2", None, "a2"), ("job-3", None, None)],
        agents=[],
        peers=[],
    )
    assert facts.bindings == {"a1": "job-1", "a2": "job-2"}
    running = classify(item("a1"), facts)
    assert running.tracked_by == ("job",) and running.job_id == "job-1"


def test_an_agent_connected_to_the_worker_is_registered_with_it() -> None:
    facts = worker_facts(WORKER, spawn_ids=[], held_jobs=[], agents=["a1"], peers=[])
    classified = classify(item("a1"), facts)
    assert classified.tracked_by == ("registered",) and classified.registered_with == WORKER


def test_a_marker_of_a_connected_peer_tracks_the_item_a_gone_node_s_does_not() -> None:
    facts = worker_facts(WORKER, spawn_ids=[], held_jobs=[], agents=[], peers=[("c1", "coordinator", True)])
    assert classify(item("a1", node="c1"), facts).tracked_by == ("spawn",)
    assert classify(item("a2", node="gone-node"), facts).tracked_by == ()


def test_a_known_coordinator_not_connected_makes_nothing_untracked() -> None:
    facts = worker_facts(
        WORKER,
        spawn_ids=[],
        held_jobs=[],
        agents=[],
        peers=[("c2", "coordinator", False), ("c1", "coordinator", True), ("w9", "worker", False)],
    )
    assert facts.stale_coordinators == ("c2",)
    assert classify(item("stray", node="gone-node"), facts).state == "unknown"
