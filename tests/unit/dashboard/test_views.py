"""Pure helpers of the dashboard's pages."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from conveyor.dashboard.views import (
    can_rerun_failed,
    exact_time,
    jobs_in_needs_order,
    open_step_index,
    relative_time,
    safe_next,
    visible_agents,
)
from conveyor.model.durations import duration_text


def _job(name: str, *needs: str, key: str = "") -> dict[str, Any]:
    return {"name": name, "needs": list(needs), "id": name + key}


def test_jobs_come_after_what_they_need_and_keep_their_order_otherwise() -> None:
    jobs = [_job("deploy", "test", "lint"), _job("test", "build"), _job("lint"), _job("build")]
    assert [j["name"] for j in jobs_in_needs_order(jobs)] == ["lint", "build", "test", "deploy"]


def test_matrix_siblings_are_all_placed_before_a_job_that_needs_them() -> None:
    jobs = [_job("test", key="-a"), _job("report", "test"), _job("test", key="-b")]
    assert [j["id"] for j in jobs_in_needs_order(jobs)] == ["test-a", "test-b", "report"]


def test_unknown_needs_and_cycles_do_not_hide_jobs() -> None:
    assert [j["name"] for j in jobs_in_needs_order([_job("a", "ghost")])] == ["a"]
    cyclic = [_job("a", "b"), _job("b", "a"), _job("c")]
    assert [j["name"] for j in jobs_in_needs_order(cyclic)] == ["c", "a", "b"]


def _steps(*statuses: str) -> dict[str, Any]:
    return {"steps": [{"step_index": i, "status": s} for i, s in enumerate(statuses)]}


@pytest.mark.parametrize(
    ("statuses", "expected"),
    [
        (("success", "failed", "skipped"), 1),
        (("success", "running", "pending"), 1),
        (("success", "success", "skipped"), 1),
        (("success", "success"), 1),
        (("pending", "pending"), 1),
        ((), None),
    ],
)
def test_a_job_opens_at_its_failing_or_running_or_last_step(
    statuses: tuple[str, ...], expected: int | None
) -> None:
    assert open_step_index(_steps(*statuses)) == expected


@pytest.mark.parametrize(
    ("start", "end", "text"),
    [
        ("2026-01-01T00:00:00Z", "2026-01-01T00:00:01.250Z", "1.2 s"),
        ("2026-01-01T00:00:00Z", "2026-01-01T00:00:42Z", "42 s"),
        ("2026-01-01T00:00:00Z", "2026-01-01T00:03:04Z", "3 min 4 s"),
        ("2026-01-01T00:00:00Z", "2026-01-01T02:05:00Z", "2 h 5 min"),
        ("2026-01-01T00:00:00Z", None, ""),
        (None, None, ""),
        ("garbage", "2026-01-01T00:00:00Z", ""),
    ],
)
def test_durations_read_like_a_person_would_say_them(start: str | None, end: str | None, text: str) -> None:
    assert duration_text(start, end) == text


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("/ui/runs/abc?x=1", "/ui/runs/abc?x=1"),
        ("/ui/events", "/ui/events"),
        (None, "/ui/runs"),
        ("", "/ui/runs"),
        ("https://evil.example/ui", "/ui/runs"),
        ("//evil.example/ui", "/ui/runs"),
        ("/api/v1/admin/tokens", "/ui/runs"),
        ("/ui\\@evil", "/ui/runs"),
        ("/ui/sign-in", "/ui/runs"),
    ],
)
def test_sign_in_returns_only_to_a_dashboard_path(target: str | None, expected: str) -> None:
    assert safe_next(target) == expected


NOW = datetime(2026, 12, 7, 12, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("moment", "text"),
    [
        (NOW, "just now"),
        (NOW - timedelta(seconds=4), "just now"),
        (NOW - timedelta(seconds=42), "42 s ago"),
        (NOW - timedelta(minutes=5, seconds=59), "5 min ago"),
        (NOW - timedelta(hours=3, minutes=1), "3 h ago"),
        (NOW - timedelta(days=2, hours=23), "2 d ago"),
        (NOW + timedelta(minutes=5), "in 5 min"),
        ("2026-12-07T11:59:00Z", "1 min ago"),
        ("2026-12-07T11:59:00", "1 min ago"),  # naive: UTC, as the API's times are
        (None, ""),
        ("", ""),
        ("yesterday", ""),
    ],
)
def test_relative_time(moment: object, text: str) -> None:
    assert relative_time(moment, NOW) == text


def test_exact_time_is_utc_to_the_millisecond() -> None:
    assert exact_time("2026-12-07T10:19:52.123456+00:00") == "2026-12-07 10:19:52.123 UTC"
    assert exact_time("2026-12-07T11:19:52+01:00") == "2026-12-07 10:19:52.000 UTC"
    assert exact_time(None) == "" and exact_time("soon") == ""


def _agent(agent_id: str, *, ephemeral: bool, state: str, gone_s: float | None) -> dict[str, Any]:
    at = None if gone_s is None else (NOW - timedelta(seconds=gone_s)).isoformat()
    return {
        "agent_id": agent_id,
        "ephemeral": ephemeral,
        "state": state,
        "disconnected_at": at,
        "last_seen_at": at,
    }


def test_ephemeral_agents_offline_longer_than_the_setting_are_hidden_unless_asked() -> None:
    agents = [
        _agent("eph-long-gone", ephemeral=True, state="offline", gone_s=3600),
        _agent("eph-just-gone", ephemeral=True, state="offline", gone_s=30),
        _agent("eph-online", ephemeral=True, state="online", gone_s=None),
        _agent("static-long-gone", ephemeral=False, state="offline", gone_s=3600),
        _agent("eph-no-time", ephemeral=True, state="offline", gone_s=None),
    ]
    shown, hidden = visible_agents(agents, NOW, 600_000, show_gone=False)
    assert [a["agent_id"] for a in shown] == [
        "eph-just-gone",
        "eph-online",
        "static-long-gone",
        "eph-no-time",
    ]
    assert hidden == 1
    everything, none_hidden = visible_agents(agents, NOW, 600_000, show_gone=True)
    assert len(everything) == 5 and none_hidden == 0
    # With 0 every offline ephemeral agent with a time is gone at once.
    assert visible_agents(agents, NOW, 0, show_gone=False)[1] == 2


@pytest.mark.parametrize(
    ("status", "offered"),
    [("failed", True), ("success", False), ("cancelled", False), ("running", False), ("queued", False)],
)
def test_rerun_failed_jobs_is_offered_on_failed_runs_only(status: str, offered: bool) -> None:
    assert can_rerun_failed(status) is offered
