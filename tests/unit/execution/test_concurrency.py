"""Concurrency admission, release, `max_parallel` and `fail_fast` decisions
(docs/design/execution.md §8.1, §8.3)."""

from datetime import UTC, datetime, timedelta
from itertools import product

import pytest

from conveyor.execution.concurrency import (
    RUN_HOLDING,
    RunAdmission,
    admit_run,
    fail_fast_applies,
    job_gate,
    lock_entry,
    runs_to_release,
    workflow_policy,
)

T0 = datetime(2025, 3, 1, tzinfo=UTC)
RUN_LIVE = ["pending", "queued", "running", "cancelling"]


def test_an_empty_group_admits_the_run_in_both_modes() -> None:
    assert admit_run(cancel_in_progress=False, max_active=1, members=[]) == RunAdmission("queued")
    assert admit_run(cancel_in_progress=True, max_active=1, members=[]) == RunAdmission("queued")


@pytest.mark.parametrize("statuses", list(product(RUN_LIVE, repeat=2)))
def test_cancel_in_progress_supersedes_every_older_run_not_already_cancelling(
    statuses: tuple[str, str],
) -> None:
    members = [("r1", statuses[0]), ("r2", statuses[1])]
    admission = admit_run(cancel_in_progress=True, max_active=1, members=members)
    assert admission.status == "queued"
    assert admission.supersede == tuple(r for r, s in members if s != "cancelling")


@pytest.mark.parametrize("max_active", [1, 2, 3])
@pytest.mark.parametrize("statuses", list(product(RUN_LIVE, repeat=2)))
def test_fifo_waits_while_the_group_is_full_or_an_older_run_waits(
    max_active: int, statuses: tuple[str, str]
) -> None:
    members = [("r1", statuses[0]), ("r2", statuses[1])]
    admission = admit_run(cancel_in_progress=False, max_active=max_active, members=members)
    holding = sum(s in RUN_HOLDING for s in statuses)
    expected = "queued" if holding < max_active and "pending" not in statuses else "pending"
    assert admission == RunAdmission(expected)  # FIFO never supersedes


def test_fifo_release_starts_the_oldest_pending_runs_that_fit() -> None:
    members = [
        ("late", "pending", T0 + timedelta(seconds=2)),
        ("early", "pending", T0),
        ("middle", "pending", T0 + timedelta(seconds=1)),
        ("busy", "running", T0 - timedelta(seconds=5)),
    ]
    assert runs_to_release(1, members) == []
    assert runs_to_release(2, members) == ["early"]
    assert runs_to_release(3, members) == ["early", "middle"]
    assert runs_to_release(10, members) == ["early", "middle", "late"]


@pytest.mark.parametrize("holder", ["queued", "running", "cancelling"])
def test_every_holding_status_occupies_a_slot(holder: str) -> None:
    assert runs_to_release(1, [("a", holder, T0), ("b", "pending", T0)]) == []
    assert runs_to_release(2, [("a", holder, T0), ("b", "pending", T0)]) == ["b"]


def test_ties_on_created_at_release_in_id_order() -> None:
    assert runs_to_release(1, [("b", "pending", T0), ("a", "pending", T0)]) == ["a"]


@pytest.mark.parametrize(
    ("run_pending", "max_parallel", "siblings", "group_busy"),
    list(product([False, True], [None, 1, 2], [0, 1, 2], [False, True])),
)
def test_job_gate_over_every_combination(
    run_pending: bool, max_parallel: int | None, siblings: int, group_busy: bool
) -> None:
    blocked = job_gate(
        run_pending=run_pending, max_parallel=max_parallel, siblings_holding=siblings, group_busy=group_busy
    )
    if run_pending:
        assert blocked == "concurrency"
    elif max_parallel is not None and siblings >= max_parallel:
        assert blocked == "max_parallel"
    elif group_busy:
        assert blocked == "concurrency"
    else:
        assert blocked is None


@pytest.mark.parametrize(
    ("status", "fail_fast", "is_matrix"),
    list(product(["success", "failed", "timed_out", "cancelled", "skipped"], [False, True], [False, True])),
)
def test_fail_fast_only_for_failed_or_timed_out_matrix_combinations(
    status: str, fail_fast: bool, is_matrix: bool
) -> None:
    expected = fail_fast and is_matrix and status in ("failed", "timed_out")
    assert fail_fast_applies(status, fail_fast=fail_fast, is_matrix=is_matrix) is expected


def test_policy_and_entries_come_from_the_stored_lock() -> None:
    lock = {
        "concurrency": {"group": "ci-{{ event.branch }}", "cancel_in_progress": True, "max": 2},
        "jobs": [{"name": "build", "max_parallel": 2, "fail_fast": True}],
    }
    assert workflow_policy(lock) == (True, 2)
    assert workflow_policy({"jobs": []}) == (False, 1)
    assert workflow_policy(None) == (False, 1)
    assert lock_entry(lock, "build")["max_parallel"] == 2
    assert lock_entry(lock, "missing") == {}
    assert lock_entry(None, "build") == {}
