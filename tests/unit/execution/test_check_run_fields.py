"""The status → check run table of docs/design/execution.md §10, derived from the stored commit state pair."""

import pytest

from conveyor.execution.reports import CHECK_RUNS, COMMIT_STATES, check_run_fields, commit_state

EXPECTED = {
    "pending": ("queued", None),
    "waiting_approval": ("queued", None),
    "queued": ("queued", None),
    "dispatched": ("queued", None),
    "running": ("in_progress", None),
    "recovering": ("in_progress", None),
    "cancelling": ("in_progress", None),
    "success": ("completed", "success"),
    "skipped": ("completed", "skipped"),
    "failed": ("completed", "failure"),
    "timed_out": ("completed", "timed_out"),
    "cancelled": ("completed", "cancelled"),
}


def test_every_status_has_a_check_run_row_and_a_commit_state() -> None:
    assert CHECK_RUNS == EXPECTED
    assert set(COMMIT_STATES) == set(EXPECTED)


@pytest.mark.parametrize("status", sorted(EXPECTED))
def test_the_stored_pair_of_each_status_gives_its_check_run_fields(status: str) -> None:
    state, description = commit_state(status)
    assert check_run_fields(state, description) == EXPECTED[status]


@pytest.mark.parametrize(
    ("state", "description"),
    [("pending", "waiting_for_something"), ("pending", ""), ("success", "Queued"), ("weird", "Failed")],
)
def test_a_pair_no_status_writes_is_an_unfinished_check_run(state: str, description: str) -> None:
    assert check_run_fields(state, description) == ("queued", None)


def test_only_finished_statuses_carry_a_conclusion() -> None:
    for status, (check_status, conclusion) in EXPECTED.items():
        assert (conclusion is not None) == (check_status == "completed"), status
