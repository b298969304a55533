"""Commit ids and ref names (pure), checked against git's own `check-ref-format`."""

from __future__ import annotations

import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conveyor.model.gitnames import (
    MAX_REF_CHARS,
    commit_id_problem,
    is_commit_id,
    ref_problem,
    repo_name_problem,
)


def git_accepts(ref: str) -> bool:
    """`git check-ref-format --allow-onelevel`, plus the leading `-` that `--branch` refuses."""
    if ref.startswith("-") or "\x00" in ref:
        return False
    completed = subprocess.run(["git", "check-ref-format", "--allow-onelevel", ref], capture_output=True)
    return completed.returncode == 0


@pytest.mark.parametrize(
    "value",
    ["a" * 40, "0123456789abcdef" * 4, "0" * 40, "f" * 64],
)
def test_full_lower_case_object_ids_are_commit_ids(value: str) -> None:
    assert is_commit_id(value) and commit_id_problem(value) is None


@pytest.mark.parametrize(
    "value",
    [
        "A" * 40,
        "a" * 39,
        "a" * 41,
        "a" * 63,
        "g" * 40,
        "HEAD",
        "",
        "--upload-pack=touch /tmp/x;true",
        None,
        40,
    ],
)
def test_anything_else_is_not_a_commit_id(value: object) -> None:
    assert not is_commit_id(value) and commit_id_problem(value) is not None


CORNERS = [
    "refs/heads/main",
    "main",
    "feature/x",
    "refs/tags/v1.0",
    "refs/heads/a&b=c#d%e",
    "refs/heads/ünï",
    "-main",
    "--upload-pack=touch /tmp/x;true",
    "refs/heads/../x",
    "refs/heads/a..b",
    "refs/heads/.hidden",
    "refs/heads/x.lock",
    "refs/heads/x.lock/y",
    "refs/heads/x.",
    "refs/heads/x/",
    "/refs/heads/x",
    "refs//heads",
    "refs/heads/a b",
    "refs/heads/a~1",
    "refs/heads/a^",
    "refs/heads/a:b",
    "refs/heads/a?",
    "refs/heads/a*",
    "refs/heads/a[",
    "refs/heads/a\\b",
    "refs/heads/a\tb",
    "refs/heads/a\x7fb",
    "refs/heads/a@{1}",
    "@",
    "a@b",
    "refs/heads/@",
    ".",
    "..",
    "",
]


@pytest.mark.parametrize("ref", CORNERS)
def test_corner_cases_agree_with_git_check_ref_format(ref: str) -> None:
    assert (ref_problem(ref) is None) == git_accepts(ref), ref


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="ab./-@{}~^:?*[\\ \t.lock", min_size=1, max_size=12))
def test_generated_names_agree_with_git_check_ref_format(ref: str) -> None:
    assert (ref_problem(ref) is None) == git_accepts(ref), ref


def test_a_ref_longer_than_its_column_is_refused() -> None:
    assert ref_problem("refs/heads/" + "a" * MAX_REF_CHARS) == f"is longer than {MAX_REF_CHARS} characters"
    assert ref_problem(None) == "is not a string"


@pytest.mark.parametrize("name", ["acme/app", "group/sub/project", "a.b/c-d_e", "owner/*"])
def test_repository_names_forges_use_are_accepted(name: str) -> None:
    assert repo_name_problem(name) is None


@pytest.mark.parametrize(
    "name",
    ["", "acme/../orgs", "acme//app", "./app", "acme/app?x=1", "acme/app#f", "a%2Fb", "a b", "-acme/app", 5],
)
def test_repository_names_that_could_steer_an_api_path_are_refused(name: object) -> None:
    assert repo_name_problem(name) is not None
