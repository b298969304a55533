"""A job's test summary as its check run's Markdown (docs/design/artifacts.md §7): counts, failing tests
as code spans (the job's text never becomes Markdown), and nothing without a report."""

from __future__ import annotations

from typing import Any

from conveyor.artifacts.summary import MAX_SUMMARY, summary_markdown


def _report(name: str, failures: list[dict[str, str]], **counts: int) -> dict[str, Any]:
    return {
        "name": name,
        "passed": 2,
        "failed": len(failures),
        "skipped": 0,
        "errors": 0,
        "failures": failures,
        **counts,
    }


def test_no_report_means_no_summary() -> None:
    assert summary_markdown([]) is None


def test_names_and_messages_are_code_spans_that_a_backtick_or_newline_cannot_break() -> None:
    text = summary_markdown(
        [_report("unit", [{"name": "t.`evil`", "message": "line one\n# heading <b>x</b>"}])]
    )
    assert text == (
        "### Tests\n\n**`unit`**: 2 passed, 1 failed, 0 skipped\n\n"
        "- `t.'evil'` `line one # heading <b>x</b>`\n"
    )


def test_errors_and_failures_past_the_named_ones_are_counted() -> None:
    text = summary_markdown([_report("unit", [{"name": "t.a", "message": ""}], failed=3, errors=2)])
    assert text is not None
    assert "**`unit`**: 2 passed, 3 failed, 0 skipped, 2 errors" in text
    assert text.endswith("- `t.a`\n- … and 4 more failing\n")


def test_a_long_summary_is_cut_on_a_line_with_a_note() -> None:
    failures = [{"name": f"t.{n}" + "x" * 480, "message": "m" * 500} for n in range(50)]
    text = summary_markdown([_report(f"r{i}", failures) for i in range(3)])
    assert text is not None and len(text) <= MAX_SUMMARY + 60
    assert text.endswith("\n\n… (cut: the run page lists every report)\n")
    assert text.splitlines()[-3].startswith("- `t.")
