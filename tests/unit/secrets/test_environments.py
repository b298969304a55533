"""Dispatch-time environment checks (docs/design/admin.md §6.1)."""

from conveyor.secrets.environments import Environment, branch_allowed, check_environment_for_dispatch


def test_a_job_without_an_environment_always_passes() -> None:
    assert check_environment_for_dispatch(None, None, "main") is None
    assert check_environment_for_dispatch("", None, "main") is None


def test_a_rendered_environment_that_does_not_exist_is_environment_not_found() -> None:
    refusal = check_environment_for_dispatch("prod", None, "main")
    assert refusal is not None
    assert refusal.code == "environment_not_found"
    assert "'prod'" in refusal.detail


def test_an_environment_without_allowed_branches_allows_every_branch() -> None:
    assert check_environment_for_dispatch("prod", Environment("prod"), "feature/x") is None
    assert check_environment_for_dispatch("prod", Environment("prod"), None) is None


def test_a_branch_outside_the_globs_is_refused_naming_the_branch_and_the_globs() -> None:
    prod = Environment("prod", allowed_branches=("main", "release/*"))
    assert check_environment_for_dispatch("prod", prod, "main") is None
    assert check_environment_for_dispatch("prod", prod, "release/1.2") is None
    refusal = check_environment_for_dispatch("prod", prod, "feature/x")
    assert refusal is not None
    assert refusal.code == "environment_branch_not_allowed"
    assert "'feature/x'" in refusal.detail and "main, release/*" in refusal.detail


def test_a_run_without_a_branch_is_refused_when_branches_are_restricted() -> None:
    refusal = check_environment_for_dispatch("prod", Environment("prod", allowed_branches=("main",)), None)
    assert refusal is not None and refusal.code == "environment_branch_not_allowed"


def test_branch_globs_behave_like_trigger_branch_filters() -> None:
    assert branch_allowed("release/1/x", ["release/**"])
    assert not branch_allowed("release/1/x", ["release/*"])
    assert branch_allowed("hotfix", ["{main,hotfix}"])
    assert not branch_allowed("Main", ["main"])
