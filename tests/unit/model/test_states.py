"""The run/job/step state machine, checked against docs/design/execution.md §4 row by row."""

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conveyor.model.states import (
    JOB_TERMINAL,
    STATUSES,
    TERMINAL,
    InvalidTransition,
    aggregate_status,
    allowed_sources,
    check,
    is_allowed,
    run_conclusion,
)

# Every legal job transition the design's table lists (None = row creation).
JOB_TABLE = {
    (None, "pending"), (None, "queued"), (None, "failed"), (None, "success"), (None, "waiting_approval"),
    ("pending", "waiting_approval"),
    ("waiting_approval", "queued"), ("waiting_approval", "pending"), ("waiting_approval", "failed"),
    ("waiting_approval", "cancelled"),
    ("pending", "queued"), ("pending", "skipped"), ("pending", "cancelled"), ("pending", "timed_out"), ("pending", "failed"),
    ("queued", "dispatched"), ("queued", "running"), ("queued", "cancelled"), ("queued", "timed_out"), ("queued", "failed"),
    ("dispatched", "running"), ("dispatched", "queued"), ("dispatched", "cancelling"),
    ("running", "recovering"), ("running", "cancelling"),
    ("recovering", "running"),
} | {(src, dst) for src in ("dispatched", "running", "recovering", "cancelling") for dst in JOB_TERMINAL}  # fmt: skip

RUN_TABLE = {
    (None, "queued"), (None, "pending"), (None, "failed"),
    ("pending", "queued"), ("pending", "cancelled"), ("pending", "failed"),
    ("queued", "running"), ("queued", "cancelling"), ("running", "cancelling"),
} | {(src, dst) for src in ("queued", "running", "cancelling") for dst in ("success", "failed", "cancelled")}  # fmt: skip

STEP_TABLE = (
    {(None, "running")}
    | {(None, s) for s in TERMINAL["step"]}
    | {("running", s) for s in ("success", "failed", "timed_out", "cancelled")}
)


@pytest.mark.parametrize(("entity", "table"), [("job", JOB_TABLE), ("run", RUN_TABLE), ("step", STEP_TABLE)])
def test_exactly_the_documented_transitions_are_allowed(
    entity: str, table: set[tuple[str | None, str]]
) -> None:
    statuses = STATUSES[entity]  # type: ignore[index]
    for src, dst in itertools.product([None, *statuses], statuses):
        assert is_allowed(entity, src, dst) == ((src, dst) in table), (entity, src, dst)  # type: ignore[arg-type]


@pytest.mark.parametrize("entity", ["run", "job", "step"])
def test_nothing_leaves_a_terminal_status(entity: str) -> None:
    for src in TERMINAL[entity]:  # type: ignore[index]
        for dst in STATUSES[entity]:  # type: ignore[index]
            with pytest.raises(InvalidTransition):
                check(entity, src, dst)  # type: ignore[arg-type]


def test_allowed_sources_feed_the_guarded_update() -> None:
    assert allowed_sources("job", "dispatched") == {"queued"}
    assert allowed_sources("job", "recovering") == {"running"}
    assert allowed_sources("job", "cancelled") == {
        "pending",
        "waiting_approval",
        "queued",
        "dispatched",
        "running",
        "recovering",
        "cancelling",
    }
    assert allowed_sources("run", "running") == {"queued"}
    # docs/design/approvals.md §2: only a waiting job is decided; a queued one is never held again.
    assert allowed_sources("job", "waiting_approval") == {"pending"}
    assert allowed_sources("job", "queued") == {"pending", "waiting_approval", "dispatched"}


def test_invalid_transition_names_both_states() -> None:
    with pytest.raises(InvalidTransition, match="job cannot go from success to running"):
        check("job", "success", "running")


@pytest.mark.parametrize(
    ("statuses", "expected"),
    [
        (["success", "success"], "success"),
        (["success", "failed", "cancelled"], "failed"),
        (["timed_out", "cancelled"], "timed_out"),
        (["cancelled", "success"], "cancelled"),
        (["skipped", "skipped"], "skipped"),
        (["skipped", "success"], "success"),
        (["success", "running"], None),
        ([], None),
    ],
)
def test_matrix_aggregate(statuses: list[str], expected: str | None) -> None:
    assert aggregate_status(statuses) == expected


@given(st.lists(st.sampled_from(sorted(JOB_TERMINAL)), min_size=1, max_size=8))
def test_aggregate_is_order_independent(statuses: list[str]) -> None:
    assert aggregate_status(statuses) == aggregate_status(list(reversed(statuses)))
    assert aggregate_status(statuses) in JOB_TERMINAL


@pytest.mark.parametrize(
    ("jobs", "kwargs", "expected"),
    [
        ([("a", "success"), ("b", "skipped")], {}, "success"),
        ([("a", "success"), ("b", "failed")], {}, "failed"),
        ([("a", "timed_out")], {}, "failed"),
        ([("a", "cancelled"), ("b", "success")], {}, "cancelled"),
        ([("a", "success")], {"cancel_requested": True}, "cancelled"),
        ([("a", "cancelled")], {"workflow_timed_out": True, "cancel_requested": True}, "failed"),
        ([("a", "success"), ("__hooks__", "failed")], {}, "success"),
        ([("a", "success"), ("__hooks__", "failed")], {"hooks_on_success_failed": True}, "failed"),
    ],
)
def test_run_conclusion(jobs: list[tuple[str, str]], kwargs: dict[str, bool], expected: str) -> None:
    options = {"cancel_requested": False, "workflow_timed_out": False, **kwargs}
    assert run_conclusion(jobs, **options) == expected
