"""Emit → route → run, outcomes, registrations sync, DLQ and retries against the real app (both dialects)."""

from __future__ import annotations

from pathlib import Path

from conveyor.events.startup import EVENTS
from tests.integration.events.conftest import CI_WORKFLOW, DEPLOY_WORKFLOW, Events, rewrite
from tests.support.repos import make_repo


async def test_operator_emit_matches_registered_workflow(events_server: Events) -> None:
    s = events_server
    await s.add_source()
    await s.push()
    regs = await s.registrations()
    assert [r["workflow_name"] for r in regs] == ["deploy"]
    assert regs[0]["trigger_kinds"] == ["event"]

    event_id = await s.emit("deploy.requested", {"env": "prod"})
    body = await s.wait_state(event_id, "processed")
    assert body["event"]["match_outcome"] == "matched"
    assert body["event"]["matched_count"] == 1
    assert len(body["runs"]) == 1 and body["runs"][0]["workflow_name"] == "deploy"
    run = (await s.api("GET", f"/runs/{body['runs'][0]['run_id']}")).json()
    assert run["event_id"] == event_id and run["registration_id"] == regs[0]["id"]

    unknown = await s.emit("nobody.listens")
    assert (await s.wait_state(unknown, "processed"))["event"]["match_outcome"] == "no-registration"
    miss = await s.emit("deploy.requested", {"env": "staging"})
    assert (await s.wait_state(miss, "processed"))["event"]["match_outcome"] == "no-trigger-match"
    elsewhere = await s.emit("deploy.requested", {"env": "prod"}, target_repos=["x/none"])
    assert (await s.wait_state(elsewhere, "processed"))["event"]["match_outcome"] == "no-target-repo"


async def test_push_prunes_and_manual_registration_keeps_others(events_server: Events) -> None:
    s = events_server
    await s.add_source()
    await s.push()
    other = DEPLOY_WORKFLOW.replace('"deploy"', '"notify"').replace("deploy.requested", "notify.requested")
    rewrite(s.repo, {"ci": CI_WORKFLOW, "deploy": DEPLOY_WORKFLOW, "notify": other})
    await s.push()
    before = {r["workflow_name"]: r["id"] for r in await s.registrations()}
    assert set(before) == {"deploy", "notify"}

    rewrite(s.repo, {"ci": CI_WORKFLOW, "deploy": DEPLOY_WORKFLOW.replace("ship", "ship2")})
    await s.push()
    after = {r["workflow_name"]: r["id"] for r in await s.registrations()}
    assert after == {"deploy": before["deploy"]}  # notify removed, deploy keeps its id

    # Another branch changes nothing.
    rewrite(s.repo, {"ci": CI_WORKFLOW})
    await s.push(ref="refs/heads/feature")
    assert {r["workflow_name"] for r in await s.registrations()} == {"deploy"}

    # A manual registration of one workflow leaves the repo's other registrations in place.
    import json

    lock = json.loads((s.repo / ".conveyor" / "conveyor.lock.json").read_text())
    rewrite(s.repo, {"notify": other})
    lock = json.loads((s.repo / ".conveyor" / "conveyor.lock.json").read_text())
    repo_name = (await s.registrations())[0]["repo"]
    answer = await s.api(
        "POST", "/registrations/manual", json={"routing_key": s.routing_key, "repo": repo_name, "lock": lock}
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["created"] == ["notify"]
    final = {r["workflow_name"]: r["id"] for r in await s.registrations()}
    assert final["deploy"] == before["deploy"] and "notify" in final

    bad = await s.api(
        "POST",
        "/registrations/manual",
        json={"routing_key": s.routing_key, "repo": repo_name, "lock": {"x": 1}},
    )
    assert bad.status_code == 400 and bad.json()["error"] == "invalid_lock_file"

    updates = (await s.api("GET", "/events", params={"name": "conveyor.registration.updated"})).json()[
        "items"
    ]
    assert len(updates) == 4  # three default-branch pushes and one manual registration


async def test_retry_backoff_then_processed_and_dlq_retry(events_server: Events) -> None:
    s = events_server
    flaky = await s.emit("flaky")
    body = await s.wait_state(flaky, "processed")
    assert body["event"]["attempts"] == 3
    assert body["event"]["match_outcome"] == "no-registration"

    doomed = await s.emit("doomed")
    body = await s.wait_state(doomed, "dlq")
    assert body["event"]["dlq_reason"] == "exhausted_retries"
    assert body["event"]["attempts"] == 5
    assert "test failure" in body["event"]["last_error"]
    dlq = (await s.api("GET", "/event-dlq")).json()["items"]
    assert [d["id"] for d in dlq] == [doomed]

    not_dlq = await s.api("POST", f"/event-dlq/{flaky}/retry")
    assert not_dlq.status_code == 409 and not_dlq.json()["error"] == "not_in_dlq"
    retried = await s.api("POST", f"/event-dlq/{doomed}/retry")
    assert retried.status_code == 200 and retried.json()["state"] == "pending"
    body = await s.wait_state(doomed, "processed")
    assert body["event"]["attempts"] == 1 and body["event"]["dlq_at"] is None
    assert "test failure" in body["event"]["last_error"]  # kept from the dead-letter time


async def test_ttl_cleanup_keeps_dlq_rows_and_discard(events_server: Events) -> None:
    s = events_server
    done = await s.emit("plain")
    await s.wait_state(done, "processed")
    doomed = await s.emit("doomed")
    await s.wait_state(doomed, "dlq")

    async def no_fence(_conn: object) -> None:
        return None

    service = s.server.state.parts.need(EVENTS)
    assert await service.cleanup(no_fence, ttl_s=0) >= 1
    assert (await s.api("GET", f"/events/{done}")).status_code == 404
    assert (await s.event(doomed))["event"]["state"] == "dlq"
    discard = await s.api("DELETE", f"/event-dlq/{doomed}")
    assert discard.status_code == 204
    assert (await s.api("GET", f"/events/{doomed}")).status_code == 404
    again = await s.api("DELETE", f"/event-dlq/{doomed}")
    assert again.status_code == 404


async def test_rm_then_refresh_recreates_from_the_default_branch(events_server: Events) -> None:
    s = events_server
    await s.add_source()
    await s.push()
    (registration,) = await s.registrations()
    assert (await s.api("DELETE", f"/registrations/{registration['id']}")).status_code == 204
    assert await s.registrations() == []
    assert (await s.api("GET", f"/registrations/{registration['id']}")).status_code == 404
    refreshed = await s.api("POST", "/registrations/refresh", json={"routing_key": s.routing_key})
    assert refreshed.status_code == 200, refreshed.text
    assert refreshed.json()["items"][0]["routing_key"] == s.routing_key
    (again,) = await s.registrations()
    assert again["workflow_name"] == "deploy" and again["id"] != registration["id"]
    unknown = await s.api("POST", "/registrations/refresh", json={"routing_key": "local:none"})
    assert unknown.status_code == 404
    modes = [
        (await s.api("GET", f"/events/{i['id']}/payload")).json()["payload"]["mode"]
        for i in (await s.api("GET", "/events", params={"name": "conveyor.registration.updated"})).json()[
            "items"
        ]
    ]
    assert sorted(modes) == ["delete", "push", "push"]


async def test_a_refresh_of_every_source_syncs_each_in_one_request_logged_once(
    events_server: Events, tmp_path: Path
) -> None:
    s = events_server
    await s.add_source()
    other = make_repo(tmp_path / "other", {"deploy": DEPLOY_WORKFLOW})
    await s.add_source("other", other)

    refreshed = await s.api("POST", "/registrations/refresh")

    assert refreshed.status_code == 200, refreshed.text
    items = refreshed.json()["items"]
    assert sorted(i["routing_key"] for i in items) == ["local:app", "local:other"]
    assert all(len(i["commit_sha"]) == 40 for i in items), items
    assert {r["routing_key"] for r in await s.registrations()} == {"local:app", "local:other"}
    logged = await s.api("GET", "/access-log", params={"action": "registrations.refresh"})
    assert [(r["status_code"], r["outcome"]) for r in logged.json()["items"]] == [(200, "allowed")]
