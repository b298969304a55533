"""Which failed teardowns are due again (docs/design/scaler.md §3, "Teardown reattempts")."""

from __future__ import annotations

from conveyor.scaler.manager.reattempts import FailedTeardown, due_teardowns


def test_a_teardown_is_due_once_the_interval_has_passed_since_its_last_attempt() -> None:
    failed = [FailedTeardown("a", 1, last_attempt_at=10.0)]
    assert due_teardowns(failed, now=14.999, interval_ms=5000) == []
    assert due_teardowns(failed, now=15.0, interval_ms=5000) == ["a"]


def test_the_longest_waiting_come_first_and_one_under_way_is_never_due() -> None:
    failed = [
        FailedTeardown("late", 1, last_attempt_at=8.0),
        FailedTeardown("early", 3, last_attempt_at=2.0),
        FailedTeardown("running", 2, last_attempt_at=0.0, in_flight=True),
    ]
    assert due_teardowns(failed, now=100.0, interval_ms=1000) == ["early", "late"]
