"""Protection rules and their decisions (docs/design/approvals.md §1–§4), case by case."""

from __future__ import annotations

import pytest

from conveyor.model.approvals import (
    Approver,
    Protection,
    decision_refusal,
    fork_refusal,
    fork_verdict,
    held_retention_reason,
    is_listed,
    protection_of,
    protection_problems,
    ref_allowed,
    ref_refusal,
    rejection_reason,
    waiting_reason,
)

ADMIN = Approver("tok-1", "release-bot", "admin")
OPERATOR = Approver("tok-2", None, "operator")


@pytest.mark.parametrize(
    ("ref", "globs", "allowed"),
    [
        ("refs/heads/main", (), True),
        (None, (), True),
        ("refs/heads/main", ("main",), True),
        ("refs/heads/main", ("refs/heads/main",), True),
        ("refs/heads/release/1.2", ("release/*",), True),
        ("refs/heads/release/1.2/x", ("release/*",), False),
        ("refs/heads/release/1.2/x", ("release/**",), True),
        ("refs/tags/v1.0", ("v*",), True),
        ("refs/heads/feature", ("main", "release/*"), False),
        ("refs/heads/Main", ("main",), False),
        (None, ("main",), False),
        ("refs/pull/3/head", ("refs/pull/*/head",), True),
    ],
)
def test_ref_globs_match_the_full_ref_or_its_short_name(
    ref: str | None, globs: tuple[str, ...], allowed: bool
) -> None:
    assert ref_allowed(ref, globs) is allowed


def test_a_ref_outside_the_rule_fails_with_the_globs_named() -> None:
    rule = Protection(("admin",), refs=("main",))
    assert ref_refusal("production", "refs/heads/main", rule) is None
    assert ref_refusal("production", "refs/heads/dev", rule) == (
        "environment_ref_not_allowed: ref refs/heads/dev may not deploy to production; its refs are main"
    )
    assert "(no ref)" in (ref_refusal("production", None, rule) or "")


@pytest.mark.parametrize(
    ("approvers", "caller", "listed"),
    [
        (("admin",), ADMIN, True),
        (("operator",), ADMIN, False),
        (("release-bot",), ADMIN, True),
        (("tok-1",), ADMIN, True),
        (("tok-1",), OPERATOR, False),
        (("operator", "someone"), OPERATOR, True),
        ((), OPERATOR, True),
    ],
)
def test_an_approver_is_named_by_role_token_id_or_label(
    approvers: tuple[str, ...], caller: Approver, listed: bool
) -> None:
    assert is_listed(caller, Protection(approvers)) is listed


def test_decisions_refuse_outsiders_and_optionally_the_triggering_token() -> None:
    rule = Protection(("admin", "operator"), prevent_self_approval=True)
    assert decision_refusal(ADMIN, "prod", rule, triggered_by=None) is None
    assert decision_refusal(ADMIN, "prod", rule, triggered_by="tok-9") is None
    refused = decision_refusal(ADMIN, "prod", rule, triggered_by="tok-1")
    assert refused is not None and refused.code == "self_approval"
    # Without the flag the triggering token may decide.
    assert decision_refusal(ADMIN, "prod", Protection(("admin",)), triggered_by="tok-1") is None
    outsider = decision_refusal(OPERATOR, "prod", Protection(("admin",)), triggered_by=None)
    assert outsider is not None and outsider.code == "not_an_approver"
    assert "admin" in outsider.detail and "operator" in outsider.detail
    # A rule removed while the job waited: anyone holding run.approve decides.
    assert decision_refusal(OPERATOR, "prod", None, triggered_by="tok-2") is None


@pytest.mark.parametrize(
    ("approvers", "refs", "wait", "fields"),
    [
        (["admin"], [], 0, []),
        (["admin", "release-bot"], ["main"], 600_000, []),
        ([], [], 0, ["approvers"]),
        (["auditor"], [], 0, ["approvers"]),
        ([""], [], 0, ["approvers"]),
        (["x" * 101], [], 0, ["approvers"]),
        ([f"t{i}" for i in range(21)], [], 0, ["approvers"]),
        (["admin"], [""], 0, ["refs"]),
        (["admin"], [f"r{i}" for i in range(21)], 0, ["refs"]),
        (["admin"], [], -1, ["wait_timer_ms"]),
        (["admin"], [], 30 * 24 * 3600 * 1000 + 1, ["wait_timer_ms"]),
        (["admin"], [], 30 * 24 * 3600 * 1000, []),
    ],
)
def test_rule_validation_names_each_bad_field(
    approvers: list[str], refs: list[str], wait: int, fields: list[str]
) -> None:
    problems = protection_problems(approvers, refs, wait)
    assert sorted({p.split(":")[0] for p in problems}) == fields


def test_the_stored_document_round_trips() -> None:
    rule = Protection(("admin", "bot"), refs=("main",), wait_timer_ms=5000, prevent_self_approval=True)
    assert protection_of(rule.as_document()) == rule
    assert protection_of(None) is None
    assert protection_of({}) is None


def test_reasons() -> None:
    assert waiting_reason("prod", Protection(("admin", "bot"))) == (
        "waiting: approval for environment prod (approvers: admin, bot)"
    )
    assert rejection_reason(ADMIN, "not today") == "rejected: release-bot: not today"
    assert rejection_reason(OPERATOR, None) == "rejected: tok-2"
    assert held_retention_reason(30) == "held_retention: waited more than 30 days for approval"


@pytest.mark.parametrize(
    ("is_fork", "policy", "verdict"),
    [
        (False, "hold", "run"),
        (False, "refuse", "run"),
        (True, "hold", "hold"),
        (True, "run-without-secrets", "run"),
        (True, "refuse", "refuse"),
        (True, "something-else", "hold"),
    ],
)
def test_a_forks_pull_request_follows_the_source_setting(is_fork: bool, policy: str, verdict: str) -> None:
    assert fork_verdict(is_fork, policy) == verdict


def test_a_refused_fork_says_why() -> None:
    assert (
        fork_refusal("refuse")
        == "pull request from a fork: the source refuses them (fork_pull_requests=refuse)"
    )
