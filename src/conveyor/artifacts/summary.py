"""A job's test summary as the Markdown of its GitHub check run (docs/design/artifacts.md §7,
docs/design/execution.md §10): the counts of each JUnit report, then the failing tests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from conveyor.artifacts import store
from conveyor.db.engine import Database

# GitHub refuses an `output.summary` over 65535 characters; the description before it is short.
MAX_SUMMARY = 60_000


def _code(text: str) -> str:
    """`text` as an inline code span, which Markdown shows as is (a backtick in it cannot end it)."""
    return "`" + " ".join(str(text).replace("`", "'").split()) + "`"


def summary_markdown(reports: Sequence[dict[str, Any]]) -> str | None:
    """Each report's counts and its failing tests (names and messages are the job's text, so they are
    shown as code, never as Markdown); None without a report. Cut at `MAX_SUMMARY` with a note."""
    if not reports:
        return None
    lines: list[str] = ["### Tests", ""]
    for report in reports:
        counts = f"{report['passed']} passed, {report['failed']} failed, {report['skipped']} skipped"
        if report.get("errors"):
            counts += f", {report['errors']} errors"
        lines.append(f"**{_code(report['name'])}**: {counts}")
        failures = report.get("failures") or []
        if failures:
            lines.append("")
        for failure in failures:
            message = f" {_code(failure['message'])}" if failure.get("message") else ""
            lines.append(f"- {_code(failure['name'])}{message}")
        unnamed = int(report["failed"]) + int(report.get("errors") or 0) - len(failures)
        if unnamed > 0:
            lines.append(f"- … and {unnamed} more failing")
        lines.append("")
    text = "\n".join(lines).rstrip() + "\n"
    if len(text) > MAX_SUMMARY:
        cut = text[:MAX_SUMMARY].rsplit("\n", 1)[0]
        text = cut + "\n\n… (cut: the run page lists every report)\n"
    return text


async def job_test_summary(db: Database, run_id: str, job_id: str | None) -> str | None:
    """The Markdown of the job's test reports for its check run; None for a run's check run or a job
    without a report."""
    if job_id is None:
        return None
    async with db.read() as conn:
        return summary_markdown(await store.test_reports_of_job(conn, run_id, job_id))
