"""The scaler backstop's decisions (docs/design/cluster.md §7.2): adopt, give back, tear down — and when not
to."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from conveyor.scaler.backstop import (
    BackstopPlan,
    BackstopView,
    SpawnRecord,
    backstop_grace_ms,
    plan_backstop,
    reap_due_at,
    view_is_sufficient,
)

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
MINUTE = timedelta(minutes=1)
STALE_MS = 30_000  # two stale windows: 60 s
FLAP_MS = 120_000
TIMEOUT_MS = 30 * 60_000


def view(**changes: object) -> BackstopView:
    base: dict[str, object] = {
        "me": "leader",
        "now": NOW,
        "last_seen": {"leader": NOW, "gone": NOW - 60 * MINUTE, "alive": NOW - timedelta(seconds=5)},
        "connected": frozenset(),
        "online": {},
        "stale_window_ms": STALE_MS,
        "flap_grace_ms": FLAP_MS,
        "stranded_timeout_ms": TIMEOUT_MS,
        "view_sufficient": True,
    }
    base.update(changes)
    return BackstopView(**base)  # type: ignore[arg-type]


def adopted(
    agent_id: str = "a1", node: str = "gone", ago: timedelta = 31 * MINUTE, by: str = "leader"
) -> SpawnRecord:
    return SpawnRecord(agent_id, node, by, NOW - ago)


def test_the_grace_is_the_longer_of_the_flap_grace_and_two_stale_windows() -> None:
    assert backstop_grace_ms(flap_grace_ms=120_000, stale_window_ms=30_000) == 120_000
    assert backstop_grace_ms(flap_grace_ms=1_000, stale_window_ms=30_000) == 60_000


@pytest.mark.parametrize(
    ("known", "connected", "sufficient"),
    [(0, 0, True), (1, 1, True), (3, 1, True), (1, 0, False), (2, 0, False)],
)
def test_the_view_is_sufficient_with_no_known_coordinator_or_one_connected(
    known: int, connected: int, sufficient: bool
) -> None:
    assert (
        view_is_sufficient(coordinator_peers_known=known, coordinator_peers_connected=connected) is sufficient
    )


def test_own_records_and_records_of_live_nodes_are_left_alone() -> None:
    records = [SpawnRecord("mine", "leader"), SpawnRecord("theirs", "alive")]
    assert plan_backstop(records, view()) == BackstopPlan()


def test_a_node_connected_here_is_live_whatever_its_heartbeat_row_says() -> None:
    plan = plan_backstop([SpawnRecord("a1", "gone")], view(connected=frozenset({"gone"})))
    assert plan == BackstopPlan()


def test_a_record_of_a_node_that_is_not_live_is_adopted_first_never_reaped_in_the_same_pass() -> None:
    records = [SpawnRecord("a1", "gone"), SpawnRecord("a2", "never-heard-of")]
    assert plan_backstop(records, view()) == BackstopPlan(adopt=("a1", "a2"))


def test_a_record_adopted_by_a_former_leader_is_taken_over_and_its_clock_restarts() -> None:
    plan = plan_backstop([adopted(by="old-leader", ago=120 * MINUTE)], view())
    assert plan == BackstopPlan(adopt=("a1",))


def test_an_adopted_record_whose_node_came_back_is_given_back() -> None:
    plan = plan_backstop([adopted(node="alive"), SpawnRecord("a2", "alive", "old-leader", NOW)], view())
    assert plan == BackstopPlan(release=("a1", "a2"))


@pytest.mark.parametrize(
    ("adopted_ago", "timeout_ms", "reaped"),
    [
        (timedelta(minutes=29), TIMEOUT_MS, False),  # the stranded timeout runs from the adoption
        (timedelta(minutes=30), TIMEOUT_MS, True),
        (timedelta(seconds=90), 60_000, True),  # a short timeout (the knob's minimum) is honoured
        (timedelta(seconds=30), 60_000, False),
    ],
)
def test_an_adopted_record_is_reaped_once_the_stranded_timeout_has_passed(
    adopted_ago: timedelta, timeout_ms: int, reaped: bool
) -> None:
    plan = plan_backstop([adopted(ago=adopted_ago)], view(stranded_timeout_ms=timeout_ms))
    assert plan.reap == (("a1",) if reaped else ())


def test_never_sooner_than_the_grace_after_the_nodes_last_heartbeat() -> None:
    # The node was heard from 100 s ago (past the stale window: not live), adopted 90 s ago with a
    # one-minute timeout: the 120 s flap grace from its last heartbeat still holds it back.
    last_seen = {"gone": NOW - timedelta(seconds=100)}
    record = adopted(ago=timedelta(seconds=90))
    current = view(last_seen=last_seen, stranded_timeout_ms=60_000)
    assert reap_due_at(record, current) == NOW + timedelta(seconds=20)
    assert plan_backstop([record], current).reap == ()
    later = view(now=NOW + timedelta(seconds=20), last_seen=last_seen, stranded_timeout_ms=60_000)
    assert plan_backstop([record], later).reap == ("a1",)


def test_a_node_that_left_no_heartbeat_is_timed_from_the_adoption() -> None:
    record = adopted(node="forgotten", ago=timedelta(seconds=100))
    current = view(stranded_timeout_ms=60_000)
    assert reap_due_at(record, current) == NOW + timedelta(seconds=20)


def test_nothing_is_reaped_while_the_cluster_view_is_insufficient() -> None:
    plan = plan_backstop([adopted(), SpawnRecord("a2", "gone")], view(view_sufficient=False))
    assert plan == BackstopPlan(adopt=("a2",))


def test_an_agent_registered_with_a_live_coordinator_is_not_stranded() -> None:
    working = {"a1": "alive", "a2": "gone", "a3": None}
    records = [adopted("a1"), adopted("a2"), adopted("a3")]
    assert plan_backstop(records, view(online=working)).reap == ("a2", "a3")


def test_a_record_someone_else_adopted_is_not_reaped_by_this_leader() -> None:
    assert reap_due_at(adopted(by="old-leader"), view()) is None
