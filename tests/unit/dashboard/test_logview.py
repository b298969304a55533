"""A step's log as the run page lays it out (conveyor.dashboard.logview)."""

from __future__ import annotations

from conveyor.dashboard.logview import GitFold, LogLine, is_setup_step, line_anchor, log_blocks, step_log_view

SETUP = (
    "[conveyor] job build on agent-1\n"
    "[conveyor] $ git init -q /w\n"
    "[conveyor] $ git fetch -q --depth 1 origin abc\n"
    "warning: redirecting to https://example.com/\n"
    "[conveyor] fetch by SHA refused; fetching main at depth 50\n"
    "[conveyor] $ git fetch -q --depth 50 origin main\n"
    "fatal: could not read\n"
    "[conveyor] checkout failed: git fetch exited with code 128\n"
)


def test_lines_are_numbered_from_one_rendered_and_timed() -> None:
    blocks = log_blocks("\x1b[31mred\x1b[0m\n<b>\n", ["2026-12-07T10:00:00.000Z", None])
    assert blocks == [
        LogLine(1, '<span class="ansi-fg-1">red</span>', "2026-12-07T10:00:00.000Z"),
        LogLine(2, "&lt;b&gt;", None),
    ]


def test_a_last_line_without_newline_counts_and_an_empty_log_has_none() -> None:
    assert [b.number for b in log_blocks("a\nb") if isinstance(b, LogLine)] == [1, 2]
    assert log_blocks("") == []
    assert [b.html for b in log_blocks("\n\n") if isinstance(b, LogLine)] == ["", ""]


def test_missing_times_leave_lines_untimed() -> None:
    assert [b.time for b in log_blocks("a\nb\n", ["t1"]) if isinstance(b, LogLine)] == ["t1", None]


def test_setup_folds_git_commands_with_their_output_and_keeps_other_lines_visible() -> None:
    blocks = log_blocks(SETUP, setup=True)
    shape = [[line.number for line in b.lines] if isinstance(b, GitFold) else b.number for b in blocks]
    assert shape == [1, [2, 3, 4], 5, [6, 7], 8]


def test_git_lines_of_a_workflow_step_are_not_folded() -> None:
    assert all(isinstance(b, LogLine) for b in log_blocks(SETUP, setup=False))


def test_the_setup_step_is_known_by_its_kind_or_by_being_step_zero_named_setup() -> None:
    assert is_setup_step({"kind": "setup", "step_index": 0, "name": "setup"})
    assert is_setup_step({"step_index": 0, "name": "setup"})
    assert not is_setup_step({"kind": "step", "step_index": 1, "name": "setup"})


def test_a_line_s_anchor_names_its_job_step_and_number() -> None:
    assert line_anchor("0190-ab", 2, 17) == "log-0190-ab-2-17"


def test_a_step_log_cut_short_says_how_much_it_shows() -> None:
    cut = step_log_view("é\n", None, setup=False, complete=False)
    assert cut.truncated and cut.shown == 3
    assert not step_log_view("a\n", None, setup=False, complete=True).truncated
