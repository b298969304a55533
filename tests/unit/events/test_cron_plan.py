"""What one cron tick decides for a schedule, before any write (pure)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from conveyor.events.cron import InvalidCron, Schedule, plan_fire
from conveyor.events.models import SCHEDULE_FIRE

ARMED = datetime(2026, 1, 1, 10, 0, tzinfo=UTC)
NIGHTLY = Schedule(
    registration_id="reg-1",
    schedule_key="nightly",
    cron="0 2 * * *",
    timezone="UTC",
    armed_at=ARMED,
    org_id="default",
    routing_key="github:acme",
    repo="acme/app",
    workflow_name="build",
    commit_sha="a" * 40,
    last_slot=None,
)


def test_a_slot_before_arming_is_not_fired() -> None:
    assert plan_fire(NIGHTLY, datetime(2026, 1, 1, 12, 0, tzinfo=UTC)) is None


def test_the_first_slot_after_arming_fires_its_schedule_event() -> None:
    fire = plan_fire(NIGHTLY, datetime(2026, 1, 2, 2, 0, 30, tzinfo=UTC))

    assert fire is not None
    assert fire.slot == datetime(2026, 1, 2, 2, 0, tzinfo=UTC)
    assert fire.skipped == 0
    assert fire.request.name == SCHEDULE_FIRE
    assert fire.request.origin == "system"
    assert fire.request.org_id == "default"
    assert fire.request.source_routing_key == "github:acme"
    assert fire.request.source_repo == "acme/app"
    assert fire.request.payload == {
        "registration_id": "reg-1",
        "workflow_name": "build",
        "repo": "acme/app",
        "routing_key": "github:acme",
        "cron": "0 2 * * *",
        "timezone": "UTC",
        "slot_at": "2026-01-02T02:00:00+00:00",
        "commit_sha": "a" * 40,
    }


def test_the_dedup_key_names_the_registration_the_schedule_and_the_slot() -> None:
    fire = plan_fire(NIGHTLY, datetime(2026, 1, 2, 3, 0, tzinfo=UTC))
    other_key = plan_fire(replace(NIGHTLY, schedule_key="other"), datetime(2026, 1, 2, 3, 0, tzinfo=UTC))

    assert fire is not None and other_key is not None
    assert fire.request.dedup_key is not None
    assert fire.request.dedup_key.startswith("cron:reg-1:")
    assert fire.request.dedup_key.endswith(":2026-01-02T02:00:00+00:00")
    assert fire.request.dedup_key != other_key.request.dedup_key


def test_a_slot_already_fired_is_not_fired_again() -> None:
    fired = replace(NIGHTLY, last_slot=datetime(2026, 1, 2, 2, 0, tzinfo=UTC))

    assert plan_fire(fired, datetime(2026, 1, 2, 23, 0, tzinfo=UTC)) is None


def test_catching_up_fires_only_the_latest_slot_and_counts_the_missed_ones() -> None:
    fired = replace(NIGHTLY, last_slot=datetime(2026, 1, 2, 2, 0, tzinfo=UTC))

    fire = plan_fire(fired, datetime(2026, 1, 5, 12, 0, tzinfo=UTC))

    assert fire is not None
    assert fire.slot == datetime(2026, 1, 5, 2, 0, tzinfo=UTC)
    assert fire.skipped == 2  # the 3rd and the 4th


def test_missed_slots_count_from_arming_when_nothing_fired_yet() -> None:
    fire = plan_fire(NIGHTLY, datetime(2026, 1, 4, 12, 0, tzinfo=UTC))

    assert fire is not None
    assert fire.slot == datetime(2026, 1, 4, 2, 0, tzinfo=UTC)
    assert fire.skipped == 2  # the 2nd and the 3rd


def test_a_schedule_in_another_timezone_fires_at_its_local_time() -> None:
    berlin = replace(NIGHTLY, timezone="Europe/Berlin")

    fire = plan_fire(berlin, datetime(2026, 1, 2, 1, 30, tzinfo=UTC))

    assert fire is not None
    assert fire.slot == datetime(2026, 1, 2, 1, 0, tzinfo=UTC)


def test_an_impossible_schedule_never_fires() -> None:
    assert plan_fire(replace(NIGHTLY, cron="0 0 31 2 *"), datetime(2026, 3, 1, tzinfo=UTC)) is None


@pytest.mark.parametrize("change", [{"cron": "not a cron"}, {"timezone": "Mars/Olympus"}])
def test_a_malformed_schedule_is_refused(change: dict[str, str]) -> None:
    with pytest.raises(InvalidCron):
        plan_fire(replace(NIGHTLY, **change), datetime(2026, 1, 2, 3, 0, tzinfo=UTC))
