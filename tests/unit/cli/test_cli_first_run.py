"""Pure pieces of the first-run fixes: delivery reports, plain tables, follow verdicts, the home lock's
holder line, token and ctx messages, the stale-lock banner and the scaffold's branch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from conveyor.admin.tokens import generate_admin_token, looks_like_admin_token, malformed_token_detail
from conveyor.agent.context import StepContextImpl, unknown_ctx_attribute
from conveyor.cli.admin.client import plain_table
from conveyor.cli.admin.outcome import delivery_pending, delivery_report, no_run_reasons
from conveyor.cli.admin.runs import follow_verdict
from conveyor.cli.authoring_scaffold import example_workflow, scaffold_branch
from conveyor.cli.run import stale_lock_banner
from conveyor.ingest.hook import commit_hook_script, hook_script, install_hook
from conveyor.server.home_lock import HomeHeld, HomeLock, acquire_home_lock, parse_holder


def _trigger(kind: str, *checks: tuple[str, bool, str]) -> dict[str, Any]:
    return {"type": kind, "checks": [{"filter": f, "ok": ok, "detail": d} for f, ok, d in checks]}


MASTER_PUSH = {
    "status": "processed",
    "skipped": None,
    "runs": [],
    "decisions": {
        "event": {"type": "push", "branch": "master"},
        "lock": {"status": "ok"},
        "workflows": [
            {
                "workflow": "ci",
                "triggers": [
                    _trigger("push", ("branches", False, "'master' matches none of glob 'main'")),
                    _trigger("pr", ("type", False, "event type is push")),
                ],
            },
            {"workflow": "release", "triggers": [_trigger("tag", ("type", False, "event type is push"))]},
        ],
    },
}


@pytest.mark.parametrize(
    ("status", "pending"), [("received", True), ("processing", True), ("processed", False), ("failed", False)]
)
def test_a_delivery_is_pending_until_processed_or_failed(status: str, pending: bool) -> None:
    assert delivery_pending({"status": status}) is pending


def test_a_no_match_names_each_workflows_failed_check_of_the_events_type() -> None:
    lines, started = delivery_report(MASTER_PUSH)
    assert started is False
    assert lines == [
        "no run started:",
        "  workflow ci: 'master' matches none of glob 'main'",
        "  workflow release: it has no push trigger",
    ]


def test_started_runs_are_listed_one_a_line() -> None:
    assert delivery_report({**MASTER_PUSH, "runs": ["r1", "r2"]}) == (
        ["started run r1", "started run r2"],
        True,
    )


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ({"status": "failed", "error": "boom"}, "the delivery failed: boom"),
        ({"status": "processed", "skipped": "skip-ci"}, "skipped: skip-ci"),
        (
            {"status": "processed", "decisions": {"lock": {"status": "missing", "detail": "no lock at abc"}}},
            "lock file missing: no lock at abc",
        ),
        ({"status": "processed", "decisions": {"lock": {"status": "ok"}, "workflows": []}}, "no workflow"),
        ({"status": "processed", "decisions": None}, "no workflow"),
        (
            {"status": "lock_missing", "error": "no lock at abc"},
            "the delivery is lock_missing: no lock at abc",
        ),
        ({"status": "ignored"}, "the delivery is ignored"),
    ],
)
def test_other_reasons_for_no_run(body: dict[str, Any], reason: str) -> None:
    assert no_run_reasons(body)[0].startswith(reason)


def test_a_workflow_whose_trigger_of_this_type_passes_every_check_still_gets_a_reason() -> None:
    body = {
        "status": "processed",
        "decisions": {
            "event": {"type": "push"},
            "workflows": [{"workflow": "w", "triggers": [_trigger("push", ("branches", True, "ok"))]}],
        },
    }
    assert no_run_reasons(body) == ["workflow w: no trigger matched"]


def test_plain_tables_keep_whole_values_aligned() -> None:
    long_id = "01a23c4d-dfcd-790d-a688-f004cd33d923"
    text = plain_table(
        [{"id": long_id, "status": None}, {"id": "x", "status": "ok"}], ["id", "status"], "runs"
    )
    assert text.splitlines() == ["runs", "id" + " " * 36 + "status", long_id, "x" + " " * 37 + "ok"]
    assert plain_table([], ["a"]) == "a\n"


@pytest.mark.parametrize(
    ("status", "line", "code"),
    [
        ("success", "run #3 ci succeeded", 0),
        ("failed", "run #3 ci did not succeed: failed", 5),
        ("cancelled", "run #3 ci did not succeed: cancelled", 5),
        ("timed_out", "run #3 ci did not succeed: timed_out", 5),
    ],
)
def test_follow_exits_0_only_on_success(status: str, line: str, code: int) -> None:
    assert follow_verdict("run #3 ci", status) == (line, code)


@pytest.mark.parametrize(
    ("text", "holder"),
    [
        ("123 http://127.0.0.1:8470\n", (123, "http://127.0.0.1:8470")),
        ("123\n", (123, None)),
        ("", (None, None)),
        ("garbage here", (None, None)),
    ],
)
def test_the_home_lock_holder_line(text: str, holder: tuple[int | None, str | None]) -> None:
    assert parse_holder(text) == holder


def test_the_home_lock_is_exclusive_and_names_its_holder(tmp_path: Path) -> None:
    home = tmp_path / "home"
    first = acquire_home_lock(home, "http://127.0.0.1:1")
    assert isinstance(first, HomeLock)
    second = acquire_home_lock(home, "http://127.0.0.1:2")
    assert isinstance(second, HomeHeld)
    assert second.url == "http://127.0.0.1:1" and second.pid is not None
    assert f"pid {second.pid} (serving http://127.0.0.1:1)" in second.message(home)
    first.release()
    first.release()  # idempotent
    third = acquire_home_lock(home, "http://127.0.0.1:3")
    assert isinstance(third, HomeLock)
    assert (home / "server.lock").read_text().split()[1] == "http://127.0.0.1:3"
    third.release()
    assert "another process" in HomeHeld(home, None, None).message(home)


def test_a_cut_admin_token_is_malformed_and_anything_else_is_not_an_admin_token() -> None:
    token = generate_admin_token()
    assert looks_like_admin_token(token)
    cut = malformed_token_detail(token[:30])
    assert "malformed" in cut and "20 characters" in cut
    assert "not an admin token" in malformed_token_detail("cvy_agent_abc")
    assert "not an admin token" in malformed_token_detail("hello")


def test_a_ctx_typo_names_ctx_and_the_closest_names() -> None:
    message = unknown_ctx_attribute("shh", dir(StepContextImpl))
    assert message == "ctx has no attribute 'shh'; did you mean ctx.sh?"
    assert "StepContextImpl" not in unknown_ctx_attribute("zzzz", dir(StepContextImpl))
    assert unknown_ctx_attribute("set_evn", ["set_env", "_private"]).endswith("did you mean ctx.set_env?")


def test_the_stale_lock_banner_is_framed_and_names_strict() -> None:
    banner = stale_lock_banner("workflow 'ci' changed").splitlines()
    assert banner[0] == banner[-1] and set(banner[0]) == {"!"}
    assert all(line.startswith("! ") for line in banner[1:-1])
    assert any("--strict" in line for line in banner) and any("lock_out_of_date" in line for line in banner)


@pytest.mark.parametrize(("current", "expected"), [("master", "master"), ("trunk", "trunk"), (None, "main")])
def test_the_scaffold_listens_on_the_current_branch(current: str | None, expected: str) -> None:
    branch = scaffold_branch(current, "main")
    assert branch == expected
    text = example_workflow(branch)
    assert f'push(branches=["{expected}"])' in text and f'pr(target="{expected}"' in text
    assert "ci-{event.branch}" in text


def test_hooks_never_fail_git_and_a_commit_hook_triggers_head(tmp_path: Path) -> None:
    for script in (hook_script("app", "/py"), commit_hook_script("app", "/py")):
        assert script.rstrip().endswith("exit 0")
        assert "-ne 5" in script  # "no run started" is not reported as a failure
    assert "git rev-parse HEAD" in commit_hook_script("app", "/py")
    repo = tmp_path / "repo"
    (repo / ".git" / "hooks").mkdir(parents=True)
    assert install_hook(repo, "app", force=False, on="commit").name == "post-commit"
    assert install_hook(repo, "app", force=False, on="push").name == "post-receive"
    (repo / ".git" / "hooks" / "post-commit").write_text("#!/bin/sh\necho mine\n")
    from conveyor.ingest.hook import HookExists

    with pytest.raises(HookExists):
        install_hook(repo, "app", force=False, on="commit")


@pytest.mark.parametrize(
    ("args", "groups"),
    [
        (None, None),
        ([], []),
        (["--help"], []),
        (["init"], []),
        (["run", "local", "push"], []),
        (["admin"], None),
        (["admin", "--help"], None),
        (["admin", "run", "list"], ["run"]),
        (["admin", "--json", "source", "trigger-local", "app"], ["source"]),
        (["admin", "--url", "http://x", "--token", "t", "delivery", "show", "1"], ["delivery"]),
        (["admin", "--url=http://x", "trust", "list"], ["trust"]),
        (["admin", "--timeout", "5", "--json", "token", "list"], ["token"]),
        (["admin", "nonsense"], None),
        (["admin", "--url", "run"], None),  # `run` is --url's value: no group named
        (["admin", "--", "run"], None),
    ],
)
def test_only_the_admin_groups_a_command_line_needs_are_built(
    args: list[str] | None, groups: list[str] | None
) -> None:
    from conveyor.cli.admin import wanted_groups

    assert wanted_groups(args) == groups
