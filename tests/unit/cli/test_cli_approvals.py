"""What `run approve|reject`, `run show` and `environment protect` decide and print without a server
(docs/design/approvals.md §1, §3)."""

from __future__ import annotations

from typing import Any

import pytest
import typer

from conveyor.cli.admin.environments import describe_protection, wait_timer_ms
from conveyor.cli.admin.runs import approval_lines, wait_lines, waiting_jobs


def job(job_id: str, name: str, status: str) -> dict[str, Any]:
    return {"id": job_id, "name": name, "display_name": name, "status": status}


JOBS = [
    job("j1", "build", "success"),
    job("j2", "deploy", "waiting_approval"),
    job("j3", "smoke", "waiting_approval"),
]


def test_without_job_every_waiting_job_is_decided_and_a_named_one_whatever_its_status() -> None:
    assert [j["id"] for j in waiting_jobs(JOBS, None)] == ["j2", "j3"]
    assert [j["id"] for j in waiting_jobs(JOBS, "deploy")] == ["j2"]
    assert [j["id"] for j in waiting_jobs(JOBS, "j3")] == ["j3"]
    # A named job that does not wait is still sent, so the server says why (409 not_waiting).
    assert [j["id"] for j in waiting_jobs(JOBS, "build")] == ["j1"]
    assert waiting_jobs(JOBS, "nope") == []
    assert waiting_jobs([job("j1", "build", "success")], None) == []


def test_run_show_says_who_may_approve() -> None:
    waiting = [{"display_name": "deploy", "environment": "prod", "approvers": ["admin", "bot"]}]
    assert approval_lines(waiting) == [
        "waiting for approval: deploy (environment prod; approvers: admin, bot)"
    ]
    assert approval_lines([{"display_name": "d", "environment": "prod", "approvers": []}]) == [
        "waiting for approval: d (environment prod; approvers: anyone with run.approve)"
    ]


def test_following_a_run_prints_why_a_job_waits_for_approval() -> None:
    reason = "waiting: approval for environment prod (approvers: admin)"
    lines = wait_lines(
        {}, [{"id": "j2", "display_name": "deploy", "status": "waiting_approval", "reason": reason}], {"j2"}
    )
    assert lines == [f"[deploy] {reason}"]


def test_protection_is_described_on_one_line() -> None:
    assert describe_protection(None) == "(none)"
    rule = {"approvers": ["admin"], "refs": ["main"], "wait_timer_ms": 600_000, "prevent_self_approval": True}
    assert describe_protection(rule) == (
        "approvers: admin; refs: main; wait timer: 600s; the triggering token may not approve"
    )


@pytest.mark.parametrize(
    ("text", "ms"), [(None, 0), ("0", 0), ("10m", 600_000), ("1h30m", 5_400_000), ("90s", 90_000)]
)
def test_the_wait_timer_takes_sdk_durations(text: str | None, ms: int) -> None:
    assert wait_timer_ms(text) == ms


@pytest.mark.parametrize("text", ["10x", "-5m", "soon"])
def test_a_bad_wait_timer_is_a_usage_error(text: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(typer.Exit) as exited:
        wait_timer_ms(text)
    assert exited.value.exit_code == 2
    assert "--wait-timer" in capsys.readouterr().err
