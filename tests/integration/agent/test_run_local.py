"""`conveyor run local` end to end: a real repository, the real CLI, the real runner."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.run_local import (
    add_workflow,
    cli,
    git,
)

pytestmark = pytest.mark.slow


def test_the_init_example_runs_and_succeeds(repo: Path) -> None:
    result = cli(repo, "run", "local", "push")
    assert result.returncode == 0, result.stdout + result.stderr
    summary = result.stdout.split("\n\n")[-1]
    assert any(line.split()[2:4] == ["check", "success"] for line in summary.splitlines()), summary
    assert "[check] $ git log -1 --oneline" in result.stdout


def test_a_failing_step_exits_1_and_the_summary_names_it(repo: Path) -> None:
    add_workflow(
        repo,
        """
        from conveyor import workflow, push, StepFailed
        ship = workflow("ship", on=push(branches=["main"]))
        build = ship.job("build", runs_on="conveyor:os:linux")

        @build.step
        def compile_it(ctx):
            print("compiling")

        @build.step
        def broken_tests(ctx):
            raise StepFailed("3 tests failed")

        deploy = ship.job("deploy", runs_on="conveyor:os:linux", needs=[build], run=lambda ctx: None)
        """,
    )
    result = cli(repo, "run", "local", "push", "--workflow", "ship")
    assert result.returncode == 1, result.stdout + result.stderr
    summary = result.stdout.split("\n\n")[-1]
    failing = [line for line in summary.splitlines() if "broken_tests" in line]
    assert failing and "failed" in failing[0] and "3 tests failed" in failing[0]
    assert any("deploy" in line and "skipped" in line for line in summary.splitlines())


def test_uncommitted_edits_run_secrets_are_masked_and_the_repo_is_untouched(repo: Path) -> None:
    add_workflow(
        repo,
        """
        from pathlib import Path
        from conveyor import workflow, push
        local = workflow("local", on=push(branches=["main"]))

        @local.job(runs_on="conveyor:os:linux")
        def show(ctx):
            print("edit:", Path("notes.txt").read_text().strip())
            print("token:", ctx.secrets.get("API_TOKEN"))
            ctx.sh("touch created-by-step")
        """,
    )
    (repo / "notes.txt").write_text("uncommitted edit\n")
    (repo / ".conveyor" / ".secrets").write_text("# local secrets\nAPI_TOKEN=tok-123456789\n")
    before = git(repo, "status", "--porcelain")
    result = cli(repo, "run", "local", "push", "--workflow", "local")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "edit: uncommitted edit" in result.stdout
    assert "token: ***" in result.stdout and "tok-123456789" not in result.stdout
    assert git(repo, "status", "--porcelain") == before
    assert not (repo / "created-by-step").exists()


def test_an_unknown_pr_action_is_a_usage_error(repo: Path) -> None:
    result = cli(repo, "run", "local", "pr:bogus")
    assert result.returncode == 2


def test_nothing_matched_exits_1_with_the_trace(repo: Path) -> None:
    result = cli(repo, "run", "local", "push", "--branch", "feature/x")
    assert result.returncode == 1
    assert "nothing to run" in result.stderr


def test_json_lines_and_junit_report(repo: Path, tmp_path: Path) -> None:
    report = tmp_path / "junit.xml"
    result = cli(repo, "run", "local", "push", "--json", "--junit", str(report))
    assert result.returncode == 0, result.stderr
    kinds = {
        line.split('"kind": "')[1].split('"')[0] for line in result.stdout.splitlines() if '"kind"' in line
    }
    assert {"log", "step", "job", "run"} <= kinds
    assert 'testcase name="check"' in report.read_text()


def _make_lock_stale(repo: Path) -> None:
    workflow = repo / ".conveyor" / "workflows" / "ci.py"
    workflow.write_text(workflow.read_text().replace('"git", "log", "-1"', '"git", "log", "-2"'))


def test_a_stale_lock_warns_in_a_frame_and_still_runs_the_working_tree(repo: Path) -> None:
    _make_lock_stale(repo)
    result = cli(repo, "run", "local", "push")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "WARNING: the committed lock file is out of date" in result.stderr
    assert "lock_out_of_date" in result.stderr and "--strict" in result.stderr
    assert result.stderr.splitlines()[0].startswith("!!!!")
    assert "[check] $ git log -2 --oneline" in result.stdout  # compiled in memory: the edit runs


def test_strict_fails_a_stale_lock_as_the_server_would(repo: Path) -> None:
    _make_lock_stale(repo)
    lock = (repo / ".conveyor" / "conveyor.lock.json").read_bytes()
    result = cli(repo, "run", "local", "push", "--strict")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "lock_out_of_date" in result.stderr and "conveyor compile" in result.stderr
    assert "[check]" not in result.stdout  # nothing ran
    assert (repo / ".conveyor" / "conveyor.lock.json").read_bytes() == lock  # nothing changed
    fresh = cli(repo, "compile")
    assert fresh.returncode == 0
    assert cli(repo, "run", "local", "push", "--strict").returncode == 0
