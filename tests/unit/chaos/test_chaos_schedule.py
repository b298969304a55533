"""The chaos fault schedule (chaos/schedule.py): deterministic in its seed, episodes never overlap on one
target, one coordinator at most is down or frozen at a time, and kinds without targets are left out."""

from __future__ import annotations

import pytest

from chaos.schedule import FaultKind, Targets, count_by_kind, plan_faults

TARGETS = Targets(
    coordinators=["c1", "c2"],
    workers=["w1", "w2"],
    agents=["a1", "a2"],
    links=[("w1", "c1"), ("w1", "c2"), ("w2", "c1"), ("w2", "c2")],
    disks=["w1", "w2"],
)


def test_the_same_seed_gives_the_same_schedule_and_another_seed_another() -> None:
    assert plan_faults(11, 600, TARGETS) == plan_faults(11, 600, TARGETS)
    assert plan_faults(11, 600, TARGETS) != plan_faults(12, 600, TARGETS)


@pytest.mark.parametrize("seed", range(20))
def test_episodes_fit_the_run_and_never_overlap_on_a_target(seed: int) -> None:
    faults = plan_faults(seed, 1800, TARGETS, mean_gap_s=5)
    assert faults and all(5 <= f.at and f.ends_at < 1800 for f in faults)
    by_target: dict[str, float] = {}
    coordinators_busy_until = 0.0
    for fault in faults:
        assert by_target.get(fault.target, -1) <= fault.at, fault.describe()
        by_target[fault.target] = fault.ends_at
        if fault.target in ("c1", "c2") and fault.kind in (FaultKind.KILL, FaultKind.FREEZE):
            assert coordinators_busy_until <= fault.at, fault.describe()
            coordinators_busy_until = fault.ends_at


def test_a_thirty_minute_run_at_the_default_gap_has_well_over_200_faults_of_every_kind() -> None:
    counts = count_by_kind(plan_faults(5, 1800, TARGETS))
    assert sum(counts.values()) >= 200
    assert all(n > 0 for n in counts.values()), counts


def test_kinds_without_targets_are_left_out() -> None:
    bare = Targets(coordinators=["c1"], workers=[], agents=["a1"], links=[], disks=[])
    kinds = {f.kind for f in plan_faults(3, 600, bare)}
    assert FaultKind.LINK_CUT not in kinds and FaultKind.DISK_FULL not in kinds
    assert plan_faults(3, 600, TARGETS, kinds=[FaultKind.PG_TERMINATE]) and {
        f.kind for f in plan_faults(3, 600, TARGETS, kinds=[FaultKind.PG_TERMINATE])
    } == {FaultKind.PG_TERMINATE}
