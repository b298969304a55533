"""Notifications, the pure part (docs/design/events.md §10): which rules fire, fixed or failed, the messages."""

from __future__ import annotations

import pytest

from conveyor.events.notify import (
    Rule,
    RunEnd,
    delivered_event,
    email_message,
    matching_rules,
    parse_smtp_url,
    ref_matches,
    run_event,
    run_url,
    secret_reference,
    shown_target,
    webhook_body,
)


def rule(
    rule_id: str = "r",
    on: tuple[str, ...] = ("failed",),
    source_id: str | None = None,
    workflow: str | None = None,
    ref_glob: str | None = None,
) -> Rule:
    return Rule(id=rule_id, source_id=source_id, on=frozenset(on), workflow=workflow, ref_glob=ref_glob)


END = RunEnd(run_id="run1", source_id="s1", workflow="ci", ref="refs/heads/main", status="failed")


@pytest.mark.parametrize(
    ("status", "previous", "expected"),
    [
        ("failed", None, "failed"),
        ("failed", "failed", "failed"),
        ("failed", "success", "failed"),
        ("success", "failed", "fixed"),
        ("success", "success", "succeeded"),
        ("success", None, "succeeded"),
        ("cancelled", "failed", None),
    ],
)
def test_run_event_is_fixed_only_for_a_success_right_after_a_failure(
    status: str, previous: str | None, expected: str | None
) -> None:
    assert run_event(status, previous) == expected


def test_a_fix_tells_fixed_rules_fixed_and_success_only_rules_succeeded() -> None:
    assert delivered_event({"failed", "fixed"}, "fixed") == "fixed"
    assert delivered_event({"succeeded"}, "fixed") == "succeeded"
    assert delivered_event({"failed", "fixed", "succeeded"}, "fixed") == "fixed"
    assert delivered_event({"failed", "fixed"}, "succeeded") is None
    assert delivered_event({"fixed"}, "failed") is None


def test_rules_filter_by_source_workflow_and_ref_glob() -> None:
    rules = [
        rule("org-wide"),
        rule("same-source", source_id="s1"),
        rule("other-source", source_id="s2"),
        rule("ci", workflow="ci"),
        rule("deploy", workflow="deploy"),
        rule("main", ref_glob="main"),
        rule("release", ref_glob="release/*"),
        rule("full-ref", ref_glob="refs/heads/ma*"),
        rule("success-only", on=("succeeded",)),
    ]
    fired = [r.id for r, told in matching_rules(rules, END, "failed")]
    assert fired == ["org-wide", "same-source", "ci", "main", "full-ref"]


def test_ref_glob_stays_within_a_segment_like_trigger_filters() -> None:
    assert ref_matches("release/*", "refs/heads/release/1.2")
    assert not ref_matches("release/*", "refs/heads/release/1/2")
    assert ref_matches("release/**", "refs/heads/release/1/2")
    assert ref_matches("v*", "refs/tags/v1.0")
    assert not ref_matches("main", None)


def test_run_url_only_when_the_public_url_is_set() -> None:
    assert run_url(None, "r1") is None
    assert run_url("https://ci.example.com/", "r1") == "https://ci.example.com/ui/runs/r1"


PAYLOAD = {
    "rule_id": "r",
    "event": "failed",
    "run_id": "run1",
    "run_number": 7,
    "source": "app",
    "repo": "acme/app",
    "workflow": "ci",
    "ref": "refs/heads/main",
    "sha": "abc1234def5678",
    "status": "failed",
    "url": "https://ci.example.com/ui/runs/run1",
}


def test_webhook_body_carries_the_run_and_a_slack_text() -> None:
    body = webhook_body(PAYLOAD)
    assert {k: body[k] for k in ("event", "run_id", "source", "workflow", "ref", "sha", "status", "url")} == {
        "event": "failed",
        "run_id": "run1",
        "source": "app",
        "workflow": "ci",
        "ref": "refs/heads/main",
        "sha": "abc1234def5678",
        "status": "failed",
        "url": "https://ci.example.com/ui/runs/run1",
    }
    assert body["text"] == (
        "app: workflow ci failed on main (abc1234), run #7\nhttps://ci.example.com/ui/runs/run1"
    )
    fixed = webhook_body({**PAYLOAD, "event": "fixed", "status": "success", "url": None})
    assert fixed["text"] == "app: workflow ci is fixed on main (abc1234), run #7"


def test_email_names_workflow_status_and_link() -> None:
    message = email_message(PAYLOAD, "ci@example.com", "team@example.com")
    assert message["Subject"] == "[Conveyor] app: workflow ci failed on main (abc1234), run #7"
    assert message["From"] == "ci@example.com" and message["To"] == "team@example.com"
    body = message.get_content()
    assert "Workflow: ci" in body and "Status:   failed" in body
    assert "https://ci.example.com/ui/runs/run1" in body


def test_smtp_url() -> None:
    plain = parse_smtp_url("smtp://mail.local:2525")
    assert (plain.host, plain.port, plain.use_tls, plain.username) == ("mail.local", 2525, False, None)
    tls = parse_smtp_url("smtps://bot%40x:p%2Fw@mail.example.com")
    assert (tls.port, tls.use_tls, tls.username, tls.password) == (465, True, "bot@x", "p/w")
    with pytest.raises(ValueError, match="CONVEYOR_SMTP_URL"):
        parse_smtp_url("http://mail")


def test_a_webhook_url_is_shown_by_host_only() -> None:
    assert (
        shown_target("webhook", "https://hooks.slack.com/services/T0/B0/secret")
        == "https://hooks.slack.com/…"
    )
    assert shown_target("webhook", "https://user:pw@h.example/x") == "https://h.example/…"
    assert shown_target("email", "team@example.com") == "team@example.com"


APPROVAL = {
    **PAYLOAD,
    "event": "approval_requested",
    "status": "waiting_approval",
    "job_id": "job1",
    "job": "deploy",
    "environment": "production",
    "approvers": ["admin", "ops-lead"],
}


def test_an_approval_request_is_told_only_to_rules_on_it_and_names_the_job_and_environment() -> None:
    rules = [rule("a", on=("approval_requested",)), rule("f", on=("failed", "fixed", "succeeded"))]
    assert [(r.id, told) for r, told in matching_rules(rules, END, "approval_requested")] == [
        ("a", "approval_requested")
    ]
    assert matching_rules([rule("a", on=("approval_requested",))], END, "failed") == []
    body = webhook_body(APPROVAL)
    assert (body["job"], body["environment"], body["approvers"]) == (
        "deploy",
        "production",
        ["admin", "ops-lead"],
    )
    assert body["text"].startswith(
        "app: workflow ci: job deploy waits for approval for environment production on main (abc1234), run #7"
    )
    assert "job" not in webhook_body(PAYLOAD), "a run's end keeps its body"
    message = email_message(APPROVAL, "ci@example.com", "team@example.com")
    assert "Approvers: admin, ops-lead" in message.get_content()
    assert "waits for approval" in message["Subject"]


def test_credentials_may_name_an_org_secret_instead_of_holding_it() -> None:
    assert secret_reference("secret:SLACK_HOOK") == "SLACK_HOOK"
    assert secret_reference("https://hooks.slack.com/x") is None and secret_reference("secret:9x") is None
    assert shown_target("webhook", "secret:SLACK_HOOK") == "secret:SLACK_HOOK"
    named = parse_smtp_url("smtp://bot@mail.local:587?password=secret:SMTP_PASSWORD")
    assert (named.username, named.password, named.password_secret) == ("bot", None, "SMTP_PASSWORD")
    assert parse_smtp_url("smtp://mail.local").password_secret is None
    with pytest.raises(ValueError, match="secret:NAME"):
        parse_smtp_url("smtp://bot@mail.local?password=plain")
    with pytest.raises(ValueError, match="give one of them"):
        parse_smtp_url("smtp://bot:pw@mail.local?password=secret:P")
