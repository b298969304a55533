"""`ended_because`: the one line `run list` and `run logs --follow` give for a failed or cancelled run."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from conveyor.model.states import RUN_STATUSES, JobEnd, ended_because

T0 = datetime(2025, 1, 1, tzinfo=UTC)


def end(name: str, status: str, reason: str | None, seconds: int | None) -> JobEnd:
    return JobEnd(name, status, reason, None if seconds is None else T0 + timedelta(seconds=seconds))


@pytest.mark.parametrize("status", [s for s in RUN_STATUSES if s not in ("failed", "cancelled")])
def test_only_failed_and_cancelled_runs_have_one(status: str) -> None:
    assert ended_because(status, "anything", [end("a", "failed", "boom", 1)]) is None


def test_the_runs_own_reason_comes_first() -> None:
    jobs = [end("build", "cancelled", "workflow_timeout", 2)]
    assert ended_because("failed", "workflow_timeout: 30m", jobs) == "workflow_timeout: 30m"


def test_the_first_job_to_fail_or_time_out_ended_the_run_not_the_siblings_it_cancelled() -> None:
    jobs = [
        end("test (3.12)", "cancelled", "fail_fast", 5),
        end("lint", "timed_out", None, 4),
        end("test (3.11)", "failed", "step_failed: unit", 3),
    ]
    assert ended_because("failed", None, jobs) == "test (3.11): step_failed: unit"
    assert ended_because("failed", None, jobs[:2]) == "lint: timed_out"  # no reason: the status


def test_a_cancelled_run_names_its_first_cancelled_job_and_who_cancelled_it() -> None:
    jobs = [
        end("deploy", "cancelled", "cancelled_by: alice", 9),
        end("build", "cancelled", "cancelled_by: bob", 2),
    ]
    assert ended_because("cancelled", None, jobs) == "build: cancelled_by: bob"


def test_an_unfinished_time_sorts_last_and_no_ended_job_gives_none() -> None:
    jobs = [end("a", "failed", "first in list", None), end("b", "failed", "finished", 7)]
    assert ended_because("failed", None, jobs) == "b: finished"
    assert ended_because("failed", None, [end("a", "skipped", "needs: x failed", 1)]) is None
