"""Pure helpers of the dashboard's pages."""

from __future__ import annotations

from typing import Any

import pytest

from conveyor.dashboard.views import duration_text, jobs_in_needs_order, open_step_index, safe_next


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
