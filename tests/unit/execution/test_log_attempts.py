"""Which execution's log a job shows, and which one a chunk naming no attempt joins (docs/design/execution.md
§9)."""

from conveyor.execution.logs import DispatchAttempt, attempt_of_unnamed, named_attempt, shown_attempt

FIRST, SECOND, THIRD = DispatchAttempt(1), DispatchAttempt(2), DispatchAttempt(3)


def test_executions_are_ordered_by_attempt_then_by_the_hop_of_their_workers_offer() -> None:
    assert DispatchAttempt(1) < DispatchAttempt(1, 1) < DispatchAttempt(1, 2) < DispatchAttempt(2)
    assert named_attempt(None) is None and named_attempt(2) == DispatchAttempt(2, 0)
    assert named_attempt(2, 3) == DispatchAttempt(2, 3)


def test_a_job_shows_the_attempt_whose_result_counts_else_the_latest_with_a_log() -> None:
    assert shown_attempt(counted=FIRST, latest=THIRD) == FIRST  # an earlier execution's result was recorded
    assert (
        shown_attempt(counted=None, latest=THIRD) == THIRD
    )  # still running, or ended by a sweep or a cancel
    assert shown_attempt(counted=None, latest=None) == FIRST  # no log yet


def test_a_chunk_naming_no_attempt_joins_the_current_attempt_else_the_one_shown() -> None:
    # A peer of the previous version: its execution is the job's current dispatch.
    assert attempt_of_unnamed(current=SECOND, counted=None, latest=FIRST) == SECOND
    # The job ended (its queue row is gone): a late chunk joins the log that counts.
    assert attempt_of_unnamed(current=None, counted=FIRST, latest=SECOND) == FIRST
    # No queue row and no result: the latest log, else the first.
    assert attempt_of_unnamed(current=None, counted=None, latest=SECOND) == SECOND
    assert attempt_of_unnamed(current=None, counted=None, latest=None) == FIRST
