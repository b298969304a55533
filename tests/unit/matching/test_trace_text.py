"""A decision trace as readable lines, the same for `preview`, `admin run show` and the run page."""

from __future__ import annotations

from conveyor.cli.authoring_render import render_run_trace
from conveyor.matching import Check, Decision, TriggerDecision, WorkflowDecision
from conveyor.matching.trace_text import event_line, run_trace_lines

PUSH = {"type": "push", "branch": "main", "sha": "0123456789abcdef0123", "changed_files": ["a.py", "b.py"]}
MATCHED = WorkflowDecision(
    workflow="ci",
    matched=True,
    matched_trigger=0,
    triggers=(
        TriggerDecision(
            index=0,
            type="push",
            matched=True,
            checks=(Check("branches", True, "main matches main"), Check("paths", True, "a.py matches **")),
        ),
        TriggerDecision(index=1, type="pr", matched=False, checks=(Check("event", False, "push is not pr"),)),
    ),
)


def test_a_runs_trace_reads_as_the_event_then_every_triggers_checks() -> None:
    trace = {"event": PUSH, "workflow": MATCHED.as_dict()}
    assert run_trace_lines(trace) == [
        "event push on main at 0123456789ab changed files: 2",
        "MATCHED  ci  (trigger 0)",
        "    trigger 0 push: matched",
        "        ok  branches: main matches main",
        "        ok  paths: a.py matches **",
        "    trigger 1 pr: not matched",
        "        NO  event: push is not pr",
    ]


def test_the_cli_prints_the_same_lines() -> None:
    trace = {"event": PUSH, "workflow": MATCHED.as_dict()}
    assert render_run_trace(trace) == "\n".join(run_trace_lines(trace))


def test_a_whole_decision_with_an_unreadable_lock_names_the_lock_and_every_workflow() -> None:
    decision = Decision(
        event=PUSH,
        lock_status="unsupported_schema",
        schema_version=9,
        workflows=(WorkflowDecision("ci", False, None, ()),),
    )
    assert run_trace_lines(decision.as_dict()) == [
        "event push on main at 0123456789ab changed files: 2",
        "lock file: unsupported_schema",
        "no match ci",
        "    no triggers: this workflow never matches",
    ]


def test_a_rerun_names_the_run_it_repeats() -> None:
    full = {"rerun": {"parent_run_id": "r-1", "failed_only": False, "by": "alice"}}
    assert run_trace_lines(full) == ["re-run of the run r-1 by alice: same commit and lock, no matching"]
    failed = {"rerun": {"parent_run_id": "r-1", "failed_only": True, "by": None}}
    assert run_trace_lines(failed) == [
        "re-run of the failed jobs of run r-1: same commit and lock, no matching"
    ]


def test_an_event_line_says_what_it_does_not_know() -> None:
    assert event_line({}) == "event ? changed files: unknown"
    pr = {"type": "pr", "action": "opened", "branch": "feat", "base_branch": "main"}
    assert event_line(pr) == "event pr (opened) on feat into main changed files: unknown"
