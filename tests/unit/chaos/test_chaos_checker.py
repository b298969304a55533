"""The chaos checker (chaos/checker.py) on hand-made histories: each invariant holds on a clean history and
fails on one with the fault it guards against injected (docs/chaos.md)."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path
from typing import Any

import pytest

from chaos.checker import (
    FinalState,
    History,
    check,
    check_counters,
    check_events,
    check_held_jobs,
    check_logs,
    check_no_double_success,
    check_runs_ended,
    check_spawns,
    check_webhooks,
    redispatched_jobs,
    render,
)
from chaos.workflows import PRELUDE

SOURCE_ID = "src-1"


def clean() -> tuple[History, FinalState]:
    """One acknowledged push that started one run of two jobs (needs), both succeeded; one resend."""
    history = History(seed=7, started_at=1000.0)
    history.records = [
        {
            "t": 1.0,
            "type": "fault",
            "phase": "start",
            "kind": "kill-9",
            "target": "w1",
            "at": 1.0,
            "duration": 1.0,
        },
        {
            "t": 2.0,
            "type": "webhook",
            "source": "r1",
            "delivery_id": "d-1",
            "kind": "main",
            "expect": ["ci"],
            "status": 202,
            "answer": "accepted",
            "delivery": "row-1",
        },
        {
            "t": 3.0,
            "type": "webhook",
            "source": "r1",
            "delivery_id": "d-1",
            "kind": "resend",
            "expect": None,
            "status": 200,
            "answer": "duplicate",
            "delivery": "row-1",
        },
        {
            "t": 4.0,
            "type": "webhook",
            "source": "r1",
            "delivery_id": "d-2",
            "kind": "branch",
            "expect": [],
            "status": None,
            "error": "ReadTimeout",
        },
    ]
    history.schedule = [{"at": 1.0, "kind": "kill-9", "target": "w1", "duration": 1.0, "detail": {}}]
    history.ledger = [
        {"job": "j-build", "step": "compile", "ws": "/h/a1/work/j-build/src", "max": 1, "at": 1003.0},
        {"job": "j-test", "step": "flaky", "ws": "/h/w1/work/j-test/src", "max": 2, "at": 1004.0},
        {"job": "j-test", "step": "flaky", "ws": "/h/w1/work/j-test/src", "max": 2, "at": 1004.5},
    ]
    state = FinalState(
        sources={"r1": SOURCE_ID},
        deliveries=[
            {
                "id": "row-1",
                "source_id": SOURCE_ID,
                "delivery_id": "d-1",
                "status": "processed",
                "run_count": 1,
            }
        ],
        runs=[
            {
                "id": "run-1",
                "delivery_id": "row-1",
                "workflow": "ci",
                "status": "success",
                "created_at": 1002.5,
            }
        ],
        jobs=[
            {"id": "j-build", "run_id": "run-1", "name": "build", "status": "success", "needs": []},
            {"id": "j-test", "run_id": "run-1", "name": "test", "status": "success", "needs": ["build"]},
        ],
        finishes=[
            {"job_id": "j-build", "status": "success", "at": 1003.5},
            {"job_id": "j-test", "status": "success", "at": 1004.8},
        ],
        events=[{"id": "e-1", "name": "__job_complete", "processed_at": 1005.0}],
        logs=[
            {
                "job_id": "j-build",
                "step_index": 1,
                "seq": 0,
                "byte_offset": 0,
                "bytes": 10,
                "job_offset": 0,
                "job_prefix": "── 1 compile ──\n",
            },
            {
                "job_id": "j-build",
                "step_index": 1,
                "seq": 1,
                "byte_offset": 10,
                "bytes": 5,
                "job_offset": 10 + len("── 1 compile ──\n".encode()),
                "job_prefix": None,
            },
        ],
    )
    return history, state


def test_a_clean_history_has_no_violation() -> None:
    history, state = clean()
    assert check(history, state) == []


def test_an_injected_double_success_fails_the_check() -> None:
    history, state = clean()
    state.finishes.append({"job_id": "j-build", "status": "success"})
    (violation,) = check(history, state)
    assert violation.invariant == "single-success" and "j-build" in violation.subject


def test_a_job_that_ended_twice_fails_even_when_only_once_successful() -> None:
    history, state = clean()
    state.finishes.append({"job_id": "j-test", "status": "failed"})
    assert [v.invariant for v in check_no_double_success(history, state)] == ["single-end"]


def test_a_step_run_again_after_a_success_in_another_workspace_fails_the_check() -> None:
    history, state = clean()
    history.ledger.append(
        {"job": "j-build", "step": "compile", "ws": "/h/w2/work/j-build/src", "max": 1, "at": 1009.0}
    )
    (violation,) = check_no_double_success(history, state)
    assert (
        violation.invariant == "steps-ran-once" and "after the job's success was recorded" in violation.detail
    )


def test_a_job_run_again_elsewhere_before_its_success_is_counted_not_a_violation() -> None:
    history, state = clean()
    history.ledger.insert(
        0, {"job": "j-build", "step": "compile", "ws": "/h/w2/work/j-build/src", "max": 1, "at": 1002.9}
    )
    assert check_no_double_success(history, state) == []
    assert redispatched_jobs(history) == 1


def test_retried_attempts_within_the_allowed_count_are_not_double_runs() -> None:
    history, state = clean()
    history.ledger.append(
        {"job": "j-test", "step": "flaky", "ws": "/h/w1/work/j-test/src", "max": 2, "at": 1004.6}
    )
    (violation,) = check_no_double_success(history, state)
    assert "ran 3 times in one workspace (at most 2 attempts)" in violation.detail


def test_a_lost_acknowledged_webhook_fails_the_check() -> None:
    history, state = clean()
    state.deliveries.clear()
    state.runs.clear()
    state.jobs.clear()
    state.finishes.clear()
    state.logs.clear()
    violations = check(history, state)
    assert {v.invariant for v in violations} == {"acked-webhook-stored"}
    assert all(v.subject == "webhook r1/d-1" for v in violations)  # the accepted one and its resend


def test_an_unanswered_webhook_is_owed_nothing() -> None:
    history, state = clean()
    history.records = [r for r in history.records if r.get("delivery_id") != "d-1"]
    state.deliveries.clear()
    assert check_webhooks(history, state) == []


@pytest.mark.parametrize("status", ["received", "failed"])
def test_an_acknowledged_delivery_never_processed_fails_the_check(status: str) -> None:
    history, state = clean()
    state.deliveries[0]["status"] = status
    (violation,) = check_webhooks(history, state)
    assert violation.invariant == "delivery-processed" and violation.at == 2.0


def test_a_push_whose_run_is_missing_or_doubled_fails_the_check() -> None:
    history, state = clean()
    missing = copy.deepcopy(state)
    missing.runs.clear()
    assert [v.invariant for v in check_webhooks(history, missing)] == ["delivery-runs"]
    doubled = copy.deepcopy(state)
    doubled.runs.append({**state.runs[0], "id": "run-2"})
    assert [v.invariant for v in check_webhooks(history, doubled)] == ["one-run-per-workflow"]


def test_a_leaked_agent_process_fails_the_check() -> None:
    history, state = clean()
    state.leaked_processes.append(
        {"pid": 4242, "cmdline": "python -m conveyor agent --ephemeral", "cwd": "/h/w1/scaler/work/x"}
    )
    (violation,) = check(history, state)
    assert violation.invariant == "no-leaked-process" and "4242" in violation.subject


def test_an_open_spawn_record_or_a_live_record_file_fails_the_check() -> None:
    history, state = clean()
    state.spawns.append({"agent_id": "sp-1", "node_id": "c1", "state": "registered"})
    state.spawn_records_left.append("/h/w1/scaler/bare-metal/sp-2.json")
    assert [v.invariant for v in check_spawns(history, state)] == ["spawns-closed", "spawns-closed"]


def unfinished(state: FinalState, **job: Any) -> FinalState:
    changed = copy.deepcopy(state)
    changed.runs[0]["status"] = "running"
    changed.jobs[1].update(job)
    changed.finishes = changed.finishes[:1]
    return changed


def test_a_run_still_going_is_legitimate_only_on_a_live_agent_or_a_connected_worker() -> None:
    history, state = clean()
    on_live_agent = unfinished(state, status="running", agent_id="a1")
    on_live_agent.agents_online = {"a1"}
    assert check_runs_ended(history, on_live_agent) == []
    on_lost_agent = unfinished(state, status="running", agent_id="a1")
    (violation,) = check_runs_ended(history, on_lost_agent)
    assert "agent a1 is gone" in violation.detail and violation.at == 2.5
    on_gone_worker = unfinished(state, status="running", agent_id="sp-1", rerouted_to="w1")
    assert "worker is not connected" in check_runs_ended(history, on_gone_worker)[0].detail
    recovering = unfinished(state, status="recovering", agent_id="a1")
    recovering.agents_online = {"a1"}
    assert check_runs_ended(history, recovering)


def test_a_terminal_run_with_an_unfinished_job_fails_the_check() -> None:
    history, state = clean()
    state.jobs[1]["status"] = "running"
    assert [v.invariant for v in check_runs_ended(history, state)] == ["run-ended"]


def test_a_held_job_needs_a_reason_that_still_applies() -> None:
    history, state = clean()
    no_reason = unfinished(state, status="pending", blocked_on=None)
    assert [v.invariant for v in check_held_jobs(history, no_reason)] == ["held-for-a-reason"]
    stale_reason = unfinished(state, status="pending", blocked_on="needs")
    (violation,) = check_held_jobs(history, stale_reason)
    assert "which have all ended" in violation.detail
    waiting = unfinished(state, status="pending", blocked_on="needs")
    waiting.jobs[0]["status"] = "running"
    assert check_held_jobs(history, waiting) == []


def test_counters_match_the_rows() -> None:
    history, state = clean()
    state.deliveries[0]["run_count"] = 2
    state.queue.append({"job_id": "j-build", "state": "pending"})
    invariants = sorted(v.invariant for v in check_counters(history, state))
    assert invariants == ["queue-depth", "run-count"]
    queued = unfinished(clean()[1], status="queued")
    assert "queued without a queue row" in check_counters(history, queued)[0].detail


def test_an_event_neither_processed_nor_dead_lettered_with_a_reason_fails_the_check() -> None:
    history, state = clean()
    state.events += [
        {
            "id": "e-2",
            "name": "chaos.ping",
            "processed_at": None,
            "dlq_at": 1006.0,
            "dlq_reason": "max_attempts",
        },
        {"id": "e-3", "name": "chaos.ping", "processed_at": None, "dlq_at": 1006.0, "dlq_reason": None},
        {"id": "e-4", "name": "chaos.ping", "processed_at": None, "dlq_at": None, "created_at": 1001.0},
    ]
    violations = check_events(history, state)
    assert [v.subject for v in violations] == ["event e-3 (chaos.ping)", "event e-4 (chaos.ping)"]
    assert violations[1].at == 1.0


def test_a_log_with_a_sequence_gap_or_a_byte_hole_fails_the_check() -> None:
    history, state = clean()
    gap = copy.deepcopy(state)
    gap.logs[1]["seq"] = 2
    assert "seq [0, 2]" in check_logs(history, gap)[0].detail
    hole = copy.deepcopy(state)
    hole.logs[1]["byte_offset"] = 11
    hole.logs[1]["job_offset"] += 1
    assert [v.invariant for v in check_logs(history, hole)] == ["log-complete", "log-complete"]
    running = copy.deepcopy(gap)
    running.jobs[0]["status"] = "running"  # a job still running may not have its last chunks yet
    assert check_logs(history, running) == []


def test_only_the_log_of_the_attempt_that_counts_is_checked() -> None:
    # A job run twice keeps each execution's chunks (docs/design/execution.md §9): the shown one's log must
    # be complete, another's (here one cut off after its first chunk) is not shown.
    history, state = clean()
    counted = copy.deepcopy(state)
    cut_off = {**counted.logs[1], "attempt": 1, "seq": 0, "byte_offset": 0, "job_offset": 0}
    counted.logs = [{**chunk, "attempt": 2} for chunk in counted.logs] + [cut_off]
    assert check_logs(history, counted) == []
    counted.jobs[0]["log_attempt"] = 1
    assert check_logs(history, counted) == []  # attempt 1's lone chunk is a whole log too
    counted.logs[-1]["seq"] = 1
    assert "seq [1]" in check_logs(history, counted)[0].detail


def test_the_report_names_the_seed_the_schedule_and_the_history_around_a_violation() -> None:
    history, state = clean()
    state.deliveries.clear()
    report = render(history, check_webhooks(history, state), window_s=1.5)
    assert "seed 7" in report and "python -m chaos --seed 7" in report
    assert "t=1.0s kill-9 w1 (1.0s)" in report
    assert "VIOLATION [acked-webhook-stored] webhook r1/d-1" in report
    assert "d-2" not in report.split("VIOLATION")[1]  # t=4.0 is outside the first violation's window


def test_a_workspace_is_told_apart_from_a_fresh_one_at_the_same_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The workflows' own prelude, as a step runs it: the agent that gets a job back wipes the job's
    # directory and checks out again at the same path.
    namespace: dict[str, Any] = {}
    exec(PRELUDE.format(ledger=str(tmp_path / "ledger")), namespace)
    source = tmp_path / "agent" / "work" / "j-build" / "src"
    source.mkdir(parents=True)
    monkeypatch.setenv("CONVEYOR_WORKSPACE", str(source))
    first, again = namespace["workspace"](), namespace["workspace"]()
    shutil.rmtree(source.parent)
    source.mkdir(parents=True)
    fresh = namespace["workspace"]()
    assert first == again
    assert first.startswith(f"{source}#") and fresh.startswith(f"{source}#")
    assert fresh != first
