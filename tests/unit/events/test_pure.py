"""Pure decisions of the event system: state, backoff, redaction, trust, rate limit, routing, cron."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from conveyor.events.cron import InvalidCron, due_slot, should_fire
from conveyor.events.emit import check_chain_depth, rate_limit_retry_after_ms, validate_request
from conveyor.events.models import EmitRejected, EmitRequest, EventSettings, NonRetryableEventError
from conveyor.events.registrations import Registration, RegistrationIndex, registered_kinds
from conveyor.events.router import EventView, route
from conveyor.events.state import processing_state
from conveyor.events.store import next_backoff
from conveyor.events.trust import Grant, TrustFacts, trust_allows
from conveyor.lockfile import Lock, parse_lock
from conveyor.model.redact import REDACTED, redact_event_payload
from tests.support.repos import make_repo

NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)

WORKFLOWS = {
    "deploy": """
from conveyor import event, workflow

deploy = workflow("deploy", on=[event("deploy.requested", match={"env": "prod"})])

@deploy.job(runs_on=["linux"])
def ship(ctx):
    ctx.sh(["echo", "ship"])
""",
    "notifier": """
from conveyor import workflow, workflows_failed_batch

notifier = workflow("notifier", on=[workflows_failed_batch(window="5m")])

@notifier.job(runs_on=["linux"])
def tell(ctx):
    ctx.sh(["echo", "tell"])
""",
    "nightly": """
from conveyor import schedule, workflow

nightly = workflow("nightly", on=[schedule("0 2 * * *")])

@nightly.job(runs_on=["linux"])
def run(ctx):
    ctx.sh(["echo", "nightly"])
""",
    "ci": """
from conveyor import push, workflow

ci = workflow("ci", on=[push(branches=["main"])])

@ci.job(runs_on=["linux"])
def build(ctx):
    ctx.sh(["echo", "build"])
""",
}


@pytest.fixture(scope="module")
def lock(tmp_path_factory: pytest.TempPathFactory) -> Lock:
    repo = make_repo(tmp_path_factory.mktemp("lock") / "repo", WORKFLOWS)
    return parse_lock((repo / ".conveyor" / "conveyor.lock.json").read_bytes())


def registration(lock: Lock, workflow: str, **overrides: Any) -> Registration:
    entry = lock.workflow(workflow)
    assert entry is not None
    values: dict[str, Any] = {
        "id": f"reg-{workflow}",
        "org_id": "default",
        "routing_key": "local:app",
        "repo": "app",
        "workflow_name": workflow,
        "entry": entry,
        "kinds": registered_kinds(entry),
        "commit_sha": "a" * 40,
        "default_branch": "main",
        "disabled": False,
        "updated_at": NOW,
    }
    values.update(overrides)
    return Registration(**values)


def view(name: str, payload: dict[str, Any] | None = None, **overrides: Any) -> EventView:
    values: dict[str, Any] = {
        "id": "ev",
        "name": name,
        "origin": "custom",
        "org_id": "default",
        "payload": payload or {},
        "source_routing_key": "local:app",
        "source_repo": "app",
    }
    values.update(overrides)
    return EventView(**values)


# --- processing state: the pure function and the SQL expression are compared in the integration tests


@pytest.mark.parametrize(
    ("row", "state"),
    [
        (
            {"dlq_at": NOW, "processed_at": NOW, "lease_owner": "n", "lease_expires_at": NOW, "attempts": 5},
            "dlq",
        ),
        (
            {
                "dlq_at": None,
                "processed_at": NOW,
                "lease_owner": None,
                "lease_expires_at": None,
                "attempts": 1,
            },
            "processed",
        ),
        (
            {
                "dlq_at": None,
                "processed_at": None,
                "lease_owner": "n",
                "lease_expires_at": NOW + timedelta(seconds=1),
                "attempts": 1,
            },
            "leased",
        ),
        (
            {
                "dlq_at": None,
                "processed_at": None,
                "lease_owner": "n",
                "lease_expires_at": NOW,
                "attempts": 1,
            },
            "retrying",
        ),
        (
            {
                "dlq_at": None,
                "processed_at": None,
                "lease_owner": None,
                "lease_expires_at": None,
                "attempts": 2,
            },
            "retrying",
        ),
        (
            {
                "dlq_at": None,
                "processed_at": None,
                "lease_owner": None,
                "lease_expires_at": None,
                "attempts": 0,
            },
            "pending",
        ),
    ],
)
def test_processing_state_precedence(row: dict[str, Any], state: str) -> None:
    assert processing_state(row, NOW) == state


def test_backoff_is_jittered_below_the_doubling_ceiling_and_capped() -> None:
    assert next_backoff(1, 5, 300, rng=lambda: 1.0) == 5
    assert next_backoff(3, 5, 300, rng=lambda: 1.0) == 20
    assert next_backoff(10, 5, 300, rng=lambda: 1.0) == 300
    assert next_backoff(4, 5, 300, rng=lambda: 0.5) == 20
    assert next_backoff(4, 5, 300, rng=lambda: 0.0) == 0


def test_redaction_at_any_depth_leaves_the_input_untouched() -> None:
    payload = {
        "claim_code": "abc",
        "nested": {"api_token": "t", "Client-Secret": "s", "list": [{"password": "p", "ok": 1}]},
        "agent_id": "a1",
        "authorization_header": "Bearer x",
    }
    original = json.loads(json.dumps(payload))
    redacted = redact_event_payload(payload)
    assert redacted["claim_code"] == REDACTED
    assert redacted["nested"]["api_token"] == REDACTED
    assert redacted["nested"]["Client-Secret"] == REDACTED
    assert redacted["nested"]["list"] == [{"password": REDACTED, "ok": 1}]
    assert redacted["authorization_header"] == REDACTED
    assert redacted["agent_id"] == "a1"
    assert payload == original


def test_trust_rules() -> None:
    same = TrustFacts("deploy", "custom", "local:a", "a")
    kwargs: dict[str, Any] = {"org_id": "default", "routing_key": "local:a", "repo": "a", "grants": []}
    assert trust_allows(same, **kwargs)
    other = TrustFacts("deploy", "custom", "local:b", "b")
    assert not trust_allows(other, **kwargs)
    grant = Grant("g", "default", "local:b", "*", "local:a", "a", ("dep*",))
    assert trust_allows(other, **{**kwargs, "grants": [grant]})
    assert not trust_allows(TrustFacts("other", "custom", "local:b", "b"), **{**kwargs, "grants": [grant]})
    foreign = Grant("g", "acme", "local:b", "*", "local:a", "a", ("*",))
    assert not trust_allows(other, **{**kwargs, "grants": [foreign]})
    assert trust_allows(TrustFacts("x", "admin", None, None), **kwargs)  # operator, org-wide
    assert not trust_allows(TrustFacts("x", "custom", None, None), **kwargs)  # fails closed
    assert trust_allows(TrustFacts("__schedule_fire", "system", "local:z", None), **kwargs)


def test_rate_limit_and_chain_depth() -> None:
    assert rate_limit_retry_after_ms(99, NOW, NOW, 100) is None
    assert rate_limit_retry_after_ms(100, NOW - timedelta(seconds=50), NOW, 100) == 10_000
    check_chain_depth(9, EventSettings())
    with pytest.raises(EmitRejected) as refused:
        check_chain_depth(10, EventSettings())
    assert refused.value.code == "chain_depth_exceeded"


@pytest.mark.parametrize(
    ("name", "origin", "payload", "code"),
    [
        ("__workflow_complete", "custom", {}, "reserved_event_name"),
        ("conveyor.x", "admin", {}, "reserved_event_name"),
        ("bad name!", "custom", {}, "invalid_event_name"),
        ("ok", "custom", [1], "invalid_payload"),
        ("ok", "custom", {"x": "y" * 70_000}, "payload_too_large"),
    ],
)
def test_emit_validation(name: str, origin: Any, payload: Any, code: str) -> None:
    with pytest.raises(EmitRejected) as refused:
        validate_request(
            EmitRequest(name=name, origin=origin, org_id="default", payload=payload), EventSettings()
        )
    assert refused.value.code == code


def test_route_outcomes_in_precedence_order(lock: Lock) -> None:
    deploy = registration(lock, "deploy")
    index = RegistrationIndex.build([deploy, registration(lock, "notifier"), registration(lock, "nightly")])
    matched = route(view("deploy.requested", {"env": "prod"}), index)
    assert matched.outcome == "matched" and [d.registration.id for d in matched.dispatch] == ["reg-deploy"]
    assert route(view("deploy.requested", {"env": "dev"}), index).outcome == "no-trigger-match"
    assert route(view("nobody"), index).outcome == "no-registration"
    assert (
        route(view("deploy.requested", {"env": "prod"}, target_repos=("x/none",)), index).outcome
        == "no-target-repo"
    )
    assert route(view("deploy.requested", {"env": "prod"}, org_id="acme"), index).outcome == "no-registration"
    blocked = view("deploy.requested", {"env": "prod"}, source_routing_key="local:other", source_repo="other")
    # deploy has no from_repos: another repository's event does not even match.
    assert route(blocked, index).outcome == "no-trigger-match"
    operator = view(
        "deploy.requested", {"env": "prod"}, origin="admin", source_routing_key=None, source_repo=None
    )
    assert route(operator, index).outcome == "matched"
    disabled = RegistrationIndex.build([registration(lock, "deploy", disabled=True)])
    assert route(view("deploy.requested", {"env": "prod"}), disabled).outcome == "no-registration"


def test_failed_completion_is_buffered_unless_from_the_failure_lifecycle(lock: Lock) -> None:
    index = RegistrationIndex.build([registration(lock, "notifier")])
    failed = view(
        "__workflow_complete",
        {"run_id": "r", "workflow_name": "ci", "repo": "app", "status": "failed"},
        origin="system",
    )
    decision = route(failed, index)
    assert decision.outcome == "buffered" and decision.buffer[0].window_ms == 300_000
    assert route(failed, index, source_run_by_failure_lifecycle=True).outcome == "no-trigger-match"
    ok = view(
        "__workflow_complete",
        {"run_id": "r", "workflow_name": "ci", "repo": "app", "status": "success"},
        origin="system",
    )
    assert route(ok, index).outcome == "no-registration"


def test_targeted_events_take_only_their_registration(lock: Lock) -> None:
    nightly = registration(lock, "nightly")
    index = RegistrationIndex.build([nightly])
    fire = {
        "registration_id": nightly.id,
        "workflow_name": "nightly",
        "repo": "app",
        "cron": "0 2 * * *",
        "timezone": "UTC",
        "slot_at": "2026-01-02T02:00:00+00:00",
    }
    assert route(view("__schedule_fire", fire, origin="system"), index).outcome == "matched"
    gone = {**fire, "registration_id": "deleted"}
    assert route(view("__schedule_fire", gone, origin="system"), index).outcome == "no-registration"
    with pytest.raises(NonRetryableEventError):
        route(view("__schedule_fire", {"workflow_name": "nightly"}, origin="system"), index)


def test_route_stays_fast_at_ten_thousand_registrations(lock: Lock) -> None:
    deploy = lock.workflow("deploy")
    assert deploy is not None
    registrations = []
    for number in range(10_000):
        trigger = deploy.triggers[0].model_copy(update={"name": f"deploy.{number % 500}"})
        entry = deploy.model_copy(update={"name": f"deploy-{number}", "triggers": [trigger]})
        registrations.append(
            registration(
                lock,
                "deploy",
                id=f"reg-{number:05d}",
                entry=entry,
                kinds=frozenset({"event"}),
                repo=f"repo-{number % 100}",
                workflow_name=entry.name,
            )
        )
    index = RegistrationIndex.build(registrations)
    event = view("deploy.7", {"env": "prod"}, origin="admin", source_routing_key=None, source_repo=None)
    timings = []
    for _ in range(50):
        started = time.perf_counter()
        decision = route(event, index)
        timings.append(time.perf_counter() - started)
    assert decision.outcome == "matched" and len(decision.dispatch) == 20
    timings.sort()
    assert timings[len(timings) // 2] < 0.005, (
        f"median route decision {timings[len(timings) // 2] * 1000:.2f} ms"
    )


def test_cron_slots() -> None:
    assert due_slot("0 2 * * *", "UTC", datetime(2026, 1, 1, 10, 0, tzinfo=UTC)) == datetime(
        2026, 1, 1, 2, 0, tzinfo=UTC
    )
    assert due_slot("*/5 * * * *", "UTC", datetime(2026, 1, 1, 10, 5, tzinfo=UTC)) == datetime(
        2026, 1, 1, 10, 5, tzinfo=UTC
    )
    assert due_slot("0 0 31 2 *", "UTC", NOW) is None
    with pytest.raises(InvalidCron):
        due_slot("not a cron", "UTC", NOW)
    with pytest.raises(InvalidCron):
        due_slot("* * * * *", "Mars/Olympus", NOW)
    # Registered at 10:00: the 02:00 slot of that day is before arming, so it never fires.
    armed = datetime(2026, 1, 1, 10, 0, tzinfo=UTC)
    assert not should_fire(due_slot("0 2 * * *", "UTC", armed), armed, None)
    next_day = datetime(2026, 1, 2, 2, 0, 30, tzinfo=UTC)
    slot = due_slot("0 2 * * *", "UTC", next_day)
    assert should_fire(slot, armed, None)
    assert not should_fire(slot, armed, slot)
    assert slot == datetime(2026, 1, 2, 2, 0, tzinfo=UTC)


def test_reserved_payloads_must_fit_their_model() -> None:
    from conveyor.events.models import reserved_payload_problem

    assert reserved_payload_problem("custom.thing", {}) is None
    assert reserved_payload_problem("__generic_webhook", {"source": "hooks", "body": {}}) is None
    assert "body" in str(reserved_payload_problem("__generic_webhook", {"source": "hooks", "body": [1]}))
    assert "registration_id" in str(
        reserved_payload_problem("__workflows_failed_batch", {"total": 1, "runs": []})
    )
    with pytest.raises(EmitRejected) as refused:
        validate_request(
            EmitRequest(
                name="__workflow_complete", origin="system", org_id="default", payload={"status": "x"}
            ),
            EventSettings(),
        )
    assert refused.value.code == "invalid_payload"
    with pytest.raises(NonRetryableEventError):
        route(view("__job_complete", {"status": "success"}, origin="system"), RegistrationIndex())
