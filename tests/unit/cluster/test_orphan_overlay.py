"""`overlay_coordinator_view`: what a coordinator adds to another node's orphan listing
(docs/design/scaler.md §7)."""

from typing import Any

from conveyor.cluster.orphans import overlay_coordinator_view


def item(vm_id: str, agent_id: str | None, state: str = "untracked", *tracked_by: str) -> dict[str, Any]:
    return {
        "vm_id": vm_id,
        "agent_id": agent_id,
        "state": state,
        "tracked_by": list(tracked_by),
        "job_id": None,
        "registered_with": None,
    }


def test_an_agent_bound_to_a_live_job_in_the_shared_database_is_tracked_by_job() -> None:
    (out,) = overlay_coordinator_view(
        [item("p1", "a1")], bindings={"a1": "job-1"}, online={}, disconnected=False
    )
    assert out["state"] == "tracked" and out["tracked_by"] == ["job"] and out["job_id"] == "job-1"


def test_an_agent_online_with_a_coordinator_is_tracked_as_registered() -> None:
    (out,) = overlay_coordinator_view(
        [item("p1", "a1")], bindings={}, online={"a1": "c2"}, disconnected=False
    )
    assert out["tracked_by"] == ["registered"] and out["registered_with"] == "c2"


def test_the_node_s_own_trackers_are_kept_and_not_repeated() -> None:
    (out,) = overlay_coordinator_view(
        [item("p1", "a1", "tracked", "spawn", "job")], bindings={"a1": "job-1"}, online={}, disconnected=True
    )
    assert out["tracked_by"] == ["spawn", "job"] and out["state"] == "tracked"


def test_nothing_is_untracked_while_the_coordinator_sees_a_partition() -> None:
    items = [item("p1", "a1"), item("vm-2", None)]
    out = overlay_coordinator_view(items, bindings={}, online={}, disconnected=True)
    assert [i["state"] for i in out] == ["unknown", "unknown"]


def test_without_a_partition_an_untracked_item_stays_untracked() -> None:
    (out,) = overlay_coordinator_view([item("p1", "a1")], bindings={"a2": "j"}, online={}, disconnected=False)
    assert out["state"] == "untracked" and out["tracked_by"] == []


def test_the_input_is_not_changed() -> None:
    original = item("p1", "a1")
    overlay_coordinator_view([original], bindings={"a1": "j"}, online={}, disconnected=False)
    assert original["tracked_by"] == [] and original["state"] == "untracked"
