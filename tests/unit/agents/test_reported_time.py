"""Which start time is stored: the agent's stamp when plausible, else the moment the message is read."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from conveyor.agents.reported_time import PLAUSIBLE_MS, reported_time

NOW = datetime(2026, 12, 5, 12, 0, 0, tzinfo=UTC)


def ms(moment: datetime) -> float:
    return moment.timestamp() * 1000


@pytest.mark.parametrize(
    ("stamp", "expected"),
    [
        (NOW - timedelta(milliseconds=40), NOW - timedelta(milliseconds=40)),
        (NOW, NOW),
        (NOW - timedelta(milliseconds=PLAUSIBLE_MS), NOW - timedelta(milliseconds=PLAUSIBLE_MS)),
        (NOW - timedelta(milliseconds=PLAUSIBLE_MS + 1), NOW),  # an old replay or a slow clock
        (NOW + timedelta(milliseconds=1), NOW),  # a clock ahead of ours
    ],
)
def test_the_agents_stamp_is_used_only_within_the_window(stamp: datetime, expected: datetime) -> None:
    assert reported_time(ms(stamp), NOW) == expected


@pytest.mark.parametrize("stamp", [None, float("inf"), 1e30, -1e30])
def test_no_or_unreadable_stamp_means_now(stamp: float | None) -> None:
    assert reported_time(stamp, NOW) == NOW
