"""`peer_liveness_window` and `forget_departed_peer` (docs/design/cluster.md §7.1–§7.2): pure decisions."""

from dataclasses import replace

import pytest

from conveyor.cluster.forget import (
    LOCAL_REFUSALS,
    ForgetFacts,
    LivenessWindow,
    forget_departed_peer,
    forget_status_code,
    peer_liveness_window,
)


@pytest.mark.parametrize(
    ("stale_ms", "grace_ms", "adopted", "expected"),
    [
        (30_000, 120_000, False, LivenessWindow("reroute-grace", 120_000)),
        (180_000, 120_000, False, LivenessWindow("stale-window", 180_000)),
        (120_000, 120_000, False, LivenessWindow("stale-window", 120_000)),
        (30_000, 120_000, True, LivenessWindow("adopter-grace", 120_000)),
        (90_000, 120_000, True, LivenessWindow("adopter-grace", 180_000)),
        (600, 1_000, True, LivenessWindow("adopter-grace", 1_200)),
    ],
)
def test_the_liveness_window_is_the_longest_rule_that_applies(
    stale_ms: int, grace_ms: int, adopted: bool, expected: LivenessWindow
) -> None:
    assert (
        peer_liveness_window(stale_window_ms=stale_ms, flap_grace_ms=grace_ms, adopted_provisions=adopted)
        == expected
    )


def test_with_the_defaults_both_windows_are_two_minutes() -> None:
    stale = 10_000 * 3
    plain = peer_liveness_window(stale_window_ms=stale, flap_grace_ms=120_000, adopted_provisions=False)
    adopter = peer_liveness_window(stale_window_ms=stale, flap_grace_ms=120_000, adopted_provisions=True)
    assert plain.ms == adopter.ms == 120_000


DEPARTED = ForgetFacts(
    target="w1",
    me="c1",
    known=True,
    connected=False,
    target_role="worker",
    left=False,
    heard_age_ms=200_000,
    window=LivenessWindow("reroute-grace", 120_000),
    runs_backstop=False,
    coordinator_peers_known=0,
    coordinator_peers_connected=0,
    acknowledged=False,
)


def test_a_departed_worker_is_forgotten() -> None:
    assert forget_departed_peer(DEPARTED).outcome == "forgotten"


def test_the_answering_coordinator_is_never_forgotten_even_when_it_looks_departed() -> None:
    assert forget_departed_peer(replace(DEPARTED, target="c1")).outcome == "self"


def test_an_unknown_peer_is_not_known_and_does_not_stop_the_fan_out() -> None:
    decision = forget_departed_peer(replace(DEPARTED, known=False, target_role=None, heard_age_ms=None))
    assert decision.outcome == "not-known"
    assert decision.outcome not in LOCAL_REFUSALS


def test_a_connected_peer_is_refused_whatever_its_heartbeat_age() -> None:
    assert forget_departed_peer(replace(DEPARTED, connected=True)).outcome == "connected"
    assert forget_departed_peer(replace(DEPARTED, connected=True, heard_age_ms=10)).outcome == "connected"


@pytest.mark.parametrize(
    ("age", "outcome"), [(0, "within-liveness-window"), (119_999, "within-liveness-window")]
)
def test_a_peer_heard_from_within_the_window_is_refused_with_the_time_left(age: int, outcome: str) -> None:
    decision = forget_departed_peer(replace(DEPARTED, heard_age_ms=age))
    assert decision.outcome == outcome
    assert decision.detail.startswith("reroute-grace:")
    assert f"{120_000 - age} ms left" in decision.detail


def test_the_window_ends_exactly_at_its_length() -> None:
    assert forget_departed_peer(replace(DEPARTED, heard_age_ms=120_000)).outcome == "forgotten"


def test_a_peer_never_heard_from_anywhere_is_forgettable() -> None:
    assert forget_departed_peer(replace(DEPARTED, heard_age_ms=None)).outcome == "forgotten"


LAST_SIBLING = replace(
    DEPARTED,
    target="c2",
    target_role="coordinator",
    runs_backstop=True,
    coordinator_peers_known=1,
    coordinator_peers_connected=0,
)


def test_forgetting_the_last_known_coordinator_of_a_backstop_needs_an_acknowledgement() -> None:
    decision = forget_departed_peer(LAST_SIBLING)
    assert decision.outcome == "backstop-acknowledgement-required"
    assert "backstop" in decision.detail


def test_the_acknowledgement_lets_it_through() -> None:
    assert forget_departed_peer(replace(LAST_SIBLING, acknowledged=True)).outcome == "forgotten"


@pytest.mark.parametrize(
    "facts",
    [
        replace(LAST_SIBLING, runs_backstop=False),
        replace(LAST_SIBLING, coordinator_peers_known=2),
        replace(LAST_SIBLING, coordinator_peers_known=2, coordinator_peers_connected=1),
        replace(LAST_SIBLING, target="w1", target_role="worker"),
    ],
    ids=["no-backstop", "another-known-coordinator", "another-connected-coordinator", "target-is-a-worker"],
)
def test_no_acknowledgement_is_needed_when_the_backstop_view_does_not_change(facts: ForgetFacts) -> None:
    assert forget_departed_peer(facts).outcome == "forgotten"


def test_the_liveness_guard_comes_before_the_backstop_guard() -> None:
    decision = forget_departed_peer(replace(LAST_SIBLING, heard_age_ms=5))
    assert decision.outcome == "within-liveness-window"


def test_local_refusals_are_exactly_the_outcomes_that_stop_the_fan_out() -> None:
    assert LOCAL_REFUSALS == {
        "self",
        "connected",
        "within-liveness-window",
        "backstop-acknowledgement-required",
        "error",
    }


@pytest.mark.parametrize(
    ("outcomes", "status"),
    [
        (["forgotten", "forgotten"], 200),
        (["forgotten", "not-connected", "timeout"], 200),
        (["within-liveness-window"], 200),
        (["forgotten", "backstop-acknowledgement-required"], 409),
        (["backstop-acknowledgement-required"], 409),
    ],
)
def test_any_acknowledgement_request_makes_the_answer_409(outcomes: list[str], status: int) -> None:
    assert forget_status_code(outcomes) == status


@pytest.mark.parametrize("age", [0, 1, 119_999])
def test_a_peer_that_left_cleanly_is_forgotten_at_once(age: int) -> None:
    assert forget_departed_peer(replace(DEPARTED, left=True, heard_age_ms=age)).outcome == "forgotten"


def test_a_clean_leave_skips_the_window_but_not_the_other_guards() -> None:
    left = replace(DEPARTED, left=True, heard_age_ms=10)
    assert forget_departed_peer(replace(left, connected=True)).outcome == "connected"
    assert forget_departed_peer(replace(left, target="c1")).outcome == "self"
    coordinator = replace(LAST_SIBLING, left=True, heard_age_ms=10)
    assert forget_departed_peer(coordinator).outcome == "backstop-acknowledgement-required"
