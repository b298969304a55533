"""Guards and producers against the real app (both dialects): trust, rate limit, scoped tokens, redaction,
failure-batch windows, completion events, generic webhooks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import select, update

from conveyor.db.tables import events, runs
from conveyor.events.emit import emit_in_tx
from conveyor.events.models import EmitRequest
from conveyor.events.startup import EVENTS
from tests.integration.events.conftest import CI_WORKFLOW, Events, rewrite
from tests.support.repos import make_repo
from tests.support.waiting import async_wait_until

LISTENER = """
from conveyor import event, workflow

listen = workflow("listen", on=[event("deploy-complete", from_repos=["a"])])

@listen.job(runs_on=["linux"])
def react(ctx):
    ctx.sh(["echo", "react"])
"""

NOTIFIER = """
from conveyor import workflow, workflows_failed_batch

notifier = workflow("notifier", on=[workflows_failed_batch(window="2s")])

@notifier.job(runs_on=["linux"])
def tell(ctx):
    ctx.sh(["echo", "tell"])
"""

HOOKED = """
from conveyor import generic_webhook, workflow

hooked = workflow("hooked", on=[generic_webhook(source="hooks", events=["build.*"])])

@hooked.job(runs_on=["linux"])
def react(ctx):
    ctx.sh(["echo", "hook"])
"""


async def _system_emit(s: Events, name: str, payload: dict[str, Any], **extra: Any) -> str:
    settings = s.server.state.parts.need(EVENTS).settings
    async with s.server.state.db.transaction() as conn:
        result = await emit_in_tx(
            conn,
            EmitRequest(name=name, origin="system", org_id="default", payload=payload, **extra),
            settings,
        )
    s.server.state.parts.need(EVENTS).wake()
    return result.event_id


async def test_trust_blocks_other_routing_keys_until_a_grant(events_server: Events, tmp_path: Path) -> None:
    s = events_server
    repo_a = make_repo(tmp_path / "a", {"ci": CI_WORKFLOW})
    repo_b = make_repo(tmp_path / "b", {"listen": LISTENER})
    a = await s.add_source("a", repo_a)
    b = await s.add_source("b", repo_b)
    await s.push(b["id"], repo_b)
    assert [r["workflow_name"] for r in await s.registrations()] == ["listen"]

    blocked = await s.emit("deploy-complete", routing_key=a["routing_key"], source_repo="a")
    assert (await s.wait_state(blocked, "processed"))["event"]["match_outcome"] == "trust-blocked"
    grant = await s.api(
        "POST",
        "/event-trust",
        json={
            "source_routing_key": a["routing_key"],
            "source_repo": "a",
            "target_routing_key": b["routing_key"],
            "target_repo": "b",
            "event_names": ["deploy-*"],
        },
    )
    assert grant.status_code == 201, grant.text
    allowed = await s.emit("deploy-complete", routing_key=a["routing_key"], source_repo="a")
    body = await s.wait_state(allowed, "processed")
    assert body["event"]["match_outcome"] == "matched" and body["runs"][0]["repo"] == "b"

    # A token scoped to A sees only A's events; B's registration and events answer 404.
    scoped = await s.server.mint("operator", routing_key=a["routing_key"])
    listed = (await s.api("GET", "/events", token=scoped)).json()["items"]
    assert {i["id"] for i in listed} == {blocked, allowed}
    updated = (await s.api("GET", "/events", params={"name": "conveyor.registration.updated"})).json()[
        "items"
    ]
    assert (await s.api("GET", f"/events/{updated[0]['id']}", token=scoped)).status_code == 404
    other_key = await s.api(
        "POST", "/events", token=scoped, json={"name": "x", "routing_key": b["routing_key"]}
    )
    assert other_key.status_code == 403


async def test_rate_limit_and_reserved_names_through_the_api(events_server: Events) -> None:
    s = events_server
    for _ in range(100):
        await s.emit("ping")
    refused = await s.api("POST", "/events", json={"name": "ping"})
    assert refused.status_code == 429 and refused.json()["error"] == "rate_limited"
    assert 1 <= int(refused.headers["Retry-After"]) <= 60
    reserved = await s.api("POST", "/events", json={"name": "conveyor.registration.updated"})
    assert reserved.status_code == 400 and reserved.json()["error"] == "reserved_event_name"
    invalid = await s.api("POST", "/events", json={"name": "bad name!"})
    assert invalid.status_code == 400 and invalid.json()["error"] == "invalid_event_name"
    before = (await s.api("GET", "/events", params={"name": "bad name!"})).json()["items"]
    assert before == []
    replay = await s.api("POST", "/events", json={"name": "once"}, headers={"Idempotency-Key": "k1"})
    again = await s.api("POST", "/events", json={"name": "once"}, headers={"Idempotency-Key": "k1"})
    assert replay.status_code == 201 and again.status_code == 200
    assert again.json() == {"event_id": replay.json()["event_id"], "created": False}


async def test_scale_up_claim_code_is_redacted_on_every_read(events_server: Events) -> None:
    s = events_server
    payload = {
        "request_id": "r1",
        "claim_code": "secret-claim",
        "nested": {"api_token": "t0k"},
        "labels": ["x"],
    }
    event_id = await _system_emit(s, "conveyor.scaler.scale_up", payload, target_repos=["nowhere"])
    async with s.server.state.db.transaction() as conn:
        await conn.execute(update(events).where(events.c.id == event_id).values(org_id=None))
    body = await s.wait_state(event_id, "processed")
    assert body["event"]["match_outcome"] == "no-registration"
    shown = (await s.api("GET", f"/events/{event_id}/payload")).json()["payload"]
    assert shown["claim_code"] == "[redacted]" and shown["nested"]["api_token"] == "[redacted]"
    assert shown["labels"] == ["x"]
    async with s.server.state.db.read() as conn:
        stored = (await conn.execute(select(events.c.payload).where(events.c.id == event_id))).scalar_one()
    assert stored["claim_code"] == "secret-claim"
    operator = await s.server.mint("operator")
    assert (await s.api("GET", f"/events/{event_id}/payload", token=operator)).status_code == 403
    assert "claim" not in str((await s.api("GET", f"/events/{event_id}", token=operator)).json())


async def test_two_failures_in_one_window_make_one_batch(events_server: Events) -> None:
    s = events_server
    rewrite(s.repo, {"ci": CI_WORKFLOW, "notifier": NOTIFIER})
    await s.add_source()
    await s.push()
    failures = [
        await _system_emit(
            s,
            "__workflow_complete",
            {
                "run_id": f"run-{n}",
                "workflow_name": "ci",
                "repo": "app",
                "status": "failed",
                "failure_class": "job_failed",
            },
            source_routing_key=s.routing_key,
            source_repo="app",
            dedup_key=f"wc:run-{n}",
        )
        for n in range(2)
    ]
    for event_id in failures:
        assert (await s.wait_state(event_id, "processed"))["event"]["match_outcome"] == "buffered"

    async def batch() -> list[dict[str, Any]]:
        return (await s.api("GET", "/events", params={"name": "__workflows_failed_batch"})).json()["items"]

    batches = await async_wait_until(batch, timeout=30, what="the batch event")
    body = await s.wait_state(batches[0]["id"], "processed")
    assert body["event"]["match_outcome"] == "matched"
    payload = (await s.api("GET", f"/events/{batches[0]['id']}/payload")).json()["payload"]
    assert payload["total"] == 2 and {r["run_id"] for r in payload["runs"]} == {"run-0", "run-1"}
    notifier_run = body["runs"][0]["run_id"]
    async with s.server.state.db.read() as conn:
        flag = (
            await conn.execute(
                select(runs.c.dispatched_by_failure_lifecycle).where(runs.c.id == notifier_run)
            )
        ).scalar_one()
    assert flag is True
    # The notifier's own failure is neither buffered nor dispatched.
    own = await _system_emit(
        s,
        "__workflow_complete",
        {"run_id": notifier_run, "workflow_name": "notifier", "repo": "app", "status": "failed"},
        source_routing_key=s.routing_key,
        source_repo="app",
        dedup_key=f"wc:{notifier_run}",
    )
    assert (await s.wait_state(own, "processed"))["event"]["match_outcome"] == "no-trigger-match"
    assert len(await batch()) == 1


async def test_cancelling_a_run_emits_completion_events_in_its_transaction(events_server: Events) -> None:
    s = events_server
    await s.add_source()
    delivery = await s.push()
    run_id = (await s.api("GET", f"/deliveries/{delivery}")).json()["runs"][0]
    assert (await s.api("POST", f"/runs/{run_id}/cancel", json={})).status_code == 202

    async def completions() -> dict[str, dict[str, Any]] | None:
        items = (await s.api("GET", "/events", params={"limit": 100})).json()["items"]
        found = {i["name"]: i for i in items if i["source_run_id"] == run_id}
        return found if {"__workflow_complete", "__job_complete"} <= set(found) else None

    found = await async_wait_until(completions, timeout=30, what="completion events")
    payload = (await s.api("GET", f"/events/{found['__workflow_complete']['id']}/payload")).json()["payload"]
    assert (
        payload["status"] == "cancelled" and payload["workflow_name"] == "ci" and payload["run_id"] == run_id
    )
    assert found["__workflow_complete"]["chain_depth"] == 1


async def test_a_generic_source_webhook_runs_a_generic_webhook_subscriber(events_server: Events) -> None:
    s = events_server
    rewrite(s.repo, {"hooked": HOOKED})
    await s.add_source()
    await s.push()
    hooks = await s.api(
        "POST",
        "/sources",
        json={"kind": "generic", "name": "hooks", "verify": "none", "event_header": "X-Event"},
    )
    assert hooks.status_code == 201, hooks.text
    answer = await s.server.client.post(
        f"/webhooks/{hooks.json()['id']}",
        json={"build": 7},
        headers={"X-Event": "build.done", "X-Delivery-Id": "d1"},
    )
    assert answer.status_code == 202, answer.text

    async def generic() -> list[dict[str, Any]]:
        return (await s.api("GET", "/events", params={"name": "__generic_webhook"})).json()["items"]

    item = (await async_wait_until(generic, timeout=30, what="the generic event"))[0]
    body = await s.wait_state(item["id"], "processed")
    assert body["event"]["match_outcome"] == "matched" and body["runs"][0]["workflow_name"] == "hooked"
    ignored = await s.server.client.post(
        f"/webhooks/{hooks.json()['id']}",
        json={"x": 1},
        headers={"X-Event": "deploy.done", "X-Delivery-Id": "d2"},
    )
    assert ignored.status_code == 202
    two = await async_wait_until(lambda: _two(generic), timeout=30, what="the second generic event")
    other = next(i for i in two if i["id"] != item["id"])
    assert (await s.wait_state(other["id"], "processed"))["event"]["match_outcome"] == "no-trigger-match"


async def _two(fetch: Any) -> list[dict[str, Any]] | None:
    items = await fetch()
    return items if len(items) == 2 else None
