"""`wait_lines` and `follow_verdict`: what `run logs --follow` prints while a job waits and at the end."""

from __future__ import annotations

from typing import Any

from conveyor.cli.admin.runs import follow_verdict, wait_lines


def job(job_id: str, status: str, reason: str | None, name: str = "build") -> dict[str, Any]:
    return {"id": job_id, "name": name, "display_name": name, "status": status, "reason": reason}


def test_each_waiting_reason_is_printed_once_when_it_changes() -> None:
    seen: dict[str, str] = {}
    only = {"j1"}
    assert wait_lines(
        seen, [job("j1", "queued", "unschedulable: no connected agent or scaler matches [gpu]")], only
    ) == ["[build] unschedulable: no connected agent or scaler matches [gpu]"]
    assert (
        wait_lines(
            seen, [job("j1", "queued", "unschedulable: no connected agent or scaler matches [gpu]")], only
        )
        == []
    )
    assert wait_lines(seen, [job("j1", "queued", "waiting: 1 matching agent busy")], only) == [
        "[build] waiting: 1 matching agent busy"
    ]


def test_running_finished_unfollowed_and_reasonless_jobs_print_nothing() -> None:
    seen: dict[str, str] = {}
    jobs = [
        job("j1", "running", "waiting: 1 matching agent busy"),
        job("j2", "failed", "unroutable: no connected agent or scaler matches [gpu]"),
        job("j3", "queued", None),
        job("j4", "queued", "waiting: max_parallel"),
    ]
    assert wait_lines(seen, jobs, {"j1", "j2", "j3"}) == []
    assert wait_lines(seen, jobs, {"j4"}) == ["[build] waiting: max_parallel"]


def test_the_last_line_carries_why_it_did_not_succeed() -> None:
    assert follow_verdict("run #1 gpu", "failed", "train: unroutable: no agent") == (
        "run #1 gpu did not succeed: failed (train: unroutable: no agent)",
        5,
    )
    assert follow_verdict("run #1 gpu", "failed") == ("run #1 gpu did not succeed: failed", 5)
    assert follow_verdict("run #2 ci", "success", "ignored") == ("run #2 ci succeeded", 0)
