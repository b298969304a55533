"""A new run's pure decisions (docs/design/execution.md §2, §8): its row, its jobs' rows, and the gates its
jobs go through in plan order (`max_parallel`, job groups, the queue's room)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from conveyor.execution.concurrency import RunAdmission
from conveyor.execution.creation import JobGates, RunOrigin, held_job_status, job_row, lock_digest, run_row
from conveyor.execution.holds import Hold
from conveyor.lockfile.models import RunsOnEntry, WorkflowEntry
from conveyor.matching import Event, PlannedJob

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
SOURCE = {"file": "ci.py", "qualname": None, "line": 1}


def workflow(**overrides: Any) -> WorkflowEntry:
    document: dict[str, Any] = {
        "name": "ci",
        "description": None,
        "source": SOURCE,
        "content_hash": "0" * 64,
        "hashed_files": [],
        "triggers": [],
        "rules": [],
        "concurrency": None,
        "timeout_ms": None,
        "hooks_runs_on": None,
        "hooks": {},
        "jobs": [],
        **overrides,
    }
    return WorkflowEntry.model_validate(document)


def planned(job: str = "build", *, group: str | None = None, matrix_key: str | None = None) -> PlannedJob:
    return PlannedJob(
        job=job,
        display=job if matrix_key is None else f"{job} ({matrix_key})",
        matrix=None if matrix_key is None else {"os": matrix_key},
        matrix_key=matrix_key,
        needs=(),
        runs_on=RunsOnEntry(labels=[], exclude=[]),
        environment=None,
        concurrency_group=group,
        rule_count=0,
    )


EVENT = Event.model_validate({"type": "push", "repo": "o/r", "ref": "refs/heads/main", "sha": "a" * 40})
ORIGIN = RunOrigin(org_id="org", source_id="src", routing_key="key", delivery_id="d1")


def new_run(admission: RunAdmission, entry: WorkflowEntry, group: str | None = None) -> dict[str, Any]:
    return run_row(
        run_id="r1",
        number=7,
        origin=ORIGIN,
        workflow=entry,
        event=EVENT,
        group=group,
        admission=admission,
        trigger_trace={"trigger": "push"},
        now=NOW,
    )


def test_a_run_admitted_at_once_is_queued_with_no_reason_and_its_lock_stored() -> None:
    entry = workflow()
    row = new_run(RunAdmission("queued"), entry)
    assert (row["status"], row["reason"], row["concurrency_key"], row["deadline_at"]) == (
        "queued",
        None,
        None,
        None,
    )
    assert (row["workflow"], row["repo"], row["ref"], row["sha"]) == (
        "ci",
        "o/r",
        "refs/heads/main",
        "a" * 40,
    )
    assert (row["number"], row["delivery_id"], row["trigger_trace"]) == (7, "d1", {"trigger": "push"})
    assert row["lock_sha256"] == lock_digest(entry)
    assert row["workflow_lock"]["name"] == "ci"


def test_a_run_waiting_for_its_group_says_which() -> None:
    row = new_run(RunAdmission("pending"), workflow(), group="deploy-o/r")
    assert (row["status"], row["reason"]) == ("pending", "waiting: concurrency group deploy-o/r")
    assert row["concurrency_key"] == "deploy-o/r"


def test_a_workflow_timeout_sets_the_run_deadline() -> None:
    row = new_run(RunAdmission("queued"), workflow(timeout_ms=60_000))
    assert row["deadline_at"] == NOW + timedelta(minutes=1)


def job(status: str, blocked_on: str | None, **values: Any) -> dict[str, Any]:
    arguments: dict[str, Any] = {
        "job_id": "j1",
        "run_id": "r1",
        "org_id": "org",
        "status": status,
        "blocked_on": blocked_on,
        "reason": None,
        "timeout_ms": None,
        "outputs": None,
        "now": NOW,
        **values,
    }
    return job_row(planned(matrix_key=values.pop("matrix_key", None)), **arguments)


def test_a_queued_job_is_stamped_queued_and_nothing_else() -> None:
    row = job("queued", None)
    assert (row["queued_at"], row["blocked_since"], row["finished_at"]) == (NOW, None, None)
    assert (row["name"], row["matrix_key"], row["display_name"]) == ("build", "", "build")


def test_a_job_kept_pending_by_a_gate_is_blocked_since_now_but_one_waiting_on_needs_is_not() -> None:
    for gate in ("concurrency", "max_parallel", "approval"):
        assert job("pending", gate)["blocked_since"] == NOW
    assert job("pending", "needs")["blocked_since"] is None
    assert job("pending", "needs")["queued_at"] is None


def test_copied_and_refused_jobs_are_finished_at_creation() -> None:
    copied = job("success", None, outputs={"version": "1"})
    assert (copied["finished_at"], copied["outputs"]) == (NOW, {"version": "1"})
    assert job("failed", None, reason="queue full")["finished_at"] == NOW


def test_a_hold_refuses_or_waits_for_approval() -> None:
    assert held_job_status(Hold(environment="prod", protection=None, failure="not allowed")) == (
        "failed",
        None,
    )
    assert held_job_status(Hold(environment=None, protection=None, held="fork")) == (
        "waiting_approval",
        "approval",
    )


def test_max_parallel_counts_the_combinations_queued_before() -> None:
    gates = JobGates(run_pending=False, max_parallel={"test": 2}, room=(10, 100))
    decided = []
    for _ in range(3):
        blocked = gates.gate("test", None)
        decided.append(blocked if blocked is not None else gates.take("test", None))
    assert decided == [True, True, "max_parallel"]
    assert gates.room == (8, 100)


def test_a_job_queued_holds_its_group_for_the_jobs_after_it() -> None:
    gates = JobGates(run_pending=False, max_parallel={}, room=(10, 100))
    assert gates.needs_group_check("deploy")
    assert gates.gate("a", "deploy") is None and gates.take("a", "deploy")
    assert not gates.needs_group_check("deploy")
    assert gates.gate("b", "deploy") == "concurrency"
    assert gates.gate("c", None) is None


def test_a_pending_run_keeps_every_job_pending_without_asking_for_groups() -> None:
    gates = JobGates(run_pending=True, max_parallel={})
    assert not gates.needs_group_check("deploy")
    assert gates.gate("a", "deploy") == "concurrency"


def test_a_full_queue_refuses_the_job_and_takes_nothing() -> None:
    gates = JobGates(run_pending=False, max_parallel={"a": 1}, room=(0, 5))
    assert not gates.take("a", "deploy")
    assert (gates.room, gates.queued_per_name, gates.groups_taken) == ((0, 5), {}, set())
