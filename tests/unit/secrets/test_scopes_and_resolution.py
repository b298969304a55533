"""Scopes, names, and which secrets and variables a job sees."""

import pytest

from conveyor.secrets.resolve import ScopedValue, scopes_visible_to_job, secrets_for_job, variables_for_job
from conveyor.secrets.scopes import (
    MAX_SECRET_BYTES,
    InvalidName,
    check_allowed_branches,
    check_environment_name,
    check_secret_name,
    check_secret_value,
    check_variable,
    parse_scope,
)


def test_the_three_scope_kinds_parse() -> None:
    assert parse_scope("org").kind == "org"
    env = parse_scope("env/prod")
    assert (env.kind, env.environment) == ("env", "prod")
    source = parse_scope("source:0190a1b2-c3d4")
    assert (source.kind, source.target) == ("source", "0190a1b2-c3d4")


@pytest.mark.parametrize(
    "bad", ["", "Org", "team", "env/", "env/Prod", "env/a/b", "source:", "/org", "org/x", "x" * 200]
)
def test_other_scopes_are_refused(bad: str) -> None:
    with pytest.raises(InvalidName) as caught:
        parse_scope(bad)
    assert caught.value.code == "invalid_scope"


def test_secret_names_follow_environment_variable_rules() -> None:
    assert check_secret_name("DEPLOY_TOKEN") == "DEPLOY_TOKEN"
    assert check_secret_name("_x9") == "_x9"
    for bad in ("9LIVES", "with-dash", "a/b", "", "A" * 129):
        with pytest.raises(InvalidName):
            check_secret_name(bad)


def test_a_value_is_at_most_64_kib_of_utf8() -> None:
    assert check_secret_value("x" * MAX_SECRET_BYTES) == b"x" * MAX_SECRET_BYTES
    with pytest.raises(InvalidName, match="at most 65536 bytes"):
        check_secret_value("é" * (MAX_SECRET_BYTES // 2 + 1))


def test_environment_names_variables_and_branch_globs_are_checked() -> None:
    assert check_environment_name("prod-eu_1") == "prod-eu_1"
    with pytest.raises(InvalidName):
        check_environment_name("Prod")
    check_variable("REGION", "eu-west-1")
    for reserved in ("PATH", "CONVEYOR_RUN_ID", "conveyor_x"):
        with pytest.raises(InvalidName, match="set by the runner"):
            check_variable(reserved, "x")
    with pytest.raises(InvalidName):
        check_variable("1BAD", "x")
    assert check_allowed_branches(["main", "release/**"]) == ["main", "release/**"]
    with pytest.raises(InvalidName):
        check_allowed_branches([""])
    with pytest.raises(InvalidName):
        check_allowed_branches(["b"] * 101)


def test_a_job_sees_org_secrets_and_its_environment_wins_on_a_clash() -> None:
    values = [
        ScopedValue("org", "TOKEN", "org-token"),
        ScopedValue("org", "ONLY_ORG", "o"),
        ScopedValue("env/prod", "TOKEN", "prod-token"),
        ScopedValue("env/staging", "TOKEN", "staging-token"),
        ScopedValue("source:s1", "webhook_secret", "hook"),
    ]
    assert secrets_for_job(values, "prod") == {"ONLY_ORG": "o", "TOKEN": "prod-token"}
    assert secrets_for_job(reversed(values), "prod") == {"ONLY_ORG": "o", "TOKEN": "prod-token"}
    assert secrets_for_job(values, None) == {"ONLY_ORG": "o", "TOKEN": "org-token"}
    assert scopes_visible_to_job("prod") == ("org", "env/prod")


def test_environment_variables_win_over_org_variables() -> None:
    assert variables_for_job({"A": "org", "B": "org"}, {"B": "env"}) == {"A": "org", "B": "env"}
    assert variables_for_job({"A": "org"}, None) == {"A": "org"}
