"""Event metrics on /metrics, a corrupt lock leaving registrations alone, and live knob overrides."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from conveyor.events.startup import EVENTS
from tests.integration.events.conftest import Events
from tests.support.repos import commit_all
from tests.support.waiting import async_wait_until


async def metric(s: Events, prefix: str) -> float:
    text = (await s.server.client.get("/metrics")).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix))


async def test_unmatched_reserved_events_and_sync_metrics(events_server: Events) -> None:
    s = events_server
    await s.add_source()
    await s.push()
    assert await metric(s, 'conveyor_registration_syncs_total{mode="push",result="ok"}') == 1
    settings = s.server.state.parts.need(EVENTS).settings
    from conveyor.events.emit import emit_in_tx
    from conveyor.events.models import EmitRequest

    async with s.server.state.db.transaction() as conn:
        fire = await emit_in_tx(
            conn,
            EmitRequest(
                name="__schedule_fire",
                origin="system",
                org_id="default",
                payload={
                    "registration_id": "deleted-registration",
                    "workflow_name": "x",
                    "repo": "app",
                    "cron": "* * * * *",
                    "timezone": "UTC",
                    "slot_at": "2026-01-01T00:00:00+00:00",
                },
            ),
            settings,
        )
    s.server.state.parts.need(EVENTS).wake()
    assert (await s.wait_state(fire.event_id, "processed"))["event"]["match_outcome"] == "no-registration"
    unmatched = 'conveyor_events_unmatched_total{event="__schedule_fire",reason="no-registration"}'
    assert await metric(s, unmatched) == 1
    custom = await s.emit("nobody.cares")
    await s.wait_state(custom, "processed")
    assert await metric(s, 'conveyor_events_processed_total{event="custom",outcome="no-registration"}') == 1
    assert await metric(s, 'conveyor_events_emitted_total{event="custom",origin="admin"}') == 1
    # The push's conveyor.registration.updated matched nothing either; custom events are never counted.
    assert await metric(s, 'conveyor_events_unmatched_total{event="conveyor.registration.updated"') == 1
    assert await metric(s, 'conveyor_events_unmatched_total{event="custom"') == 0
    refused = await s.api("POST", "/events", json={"name": "__x"})
    assert refused.status_code == 400
    assert await metric(s, 'conveyor_events_rejected_total{event="__x",reason="reserved_event_name"}') == 1


async def test_each_failed_attempt_counts_a_retry_and_an_exhausted_event_counts_a_dead_letter(
    events_server: Events,
) -> None:
    s = events_server
    retries = 'conveyor_events_retries_total{event="custom"}'
    dead = 'conveyor_events_dlq_total{event="custom",reason="exhausted_retries"}'
    # "flaky" fails twice, then is processed: two retries, no dead letter.
    flaky = await s.emit("flaky")
    assert (await s.wait_state(flaky, "processed"))["event"]["attempts"] == 3
    assert await metric(s, retries) == 2
    assert await metric(s, dead) == 0
    # "doomed" fails all 5 attempts: four more retries, then one dead letter (the fifth failure is not a retry).
    doomed = await s.emit("doomed")
    assert (await s.wait_state(doomed, "dlq"))["event"]["dlq_reason"] == "exhausted_retries"
    assert await metric(s, retries) == 6
    assert await metric(s, dead) == 1
    assert await metric(s, 'conveyor_events_attempts_count{event="custom",result="dlq"}') == 1


async def test_a_corrupt_lock_on_the_default_branch_changes_no_registration(events_server: Events) -> None:
    s = events_server
    await s.add_source()
    await s.push()
    before = await s.registrations()
    (s.repo / ".conveyor" / "conveyor.lock.json").write_text("{not json")
    commit_all(s.repo, "corrupt lock")
    await s.push()
    assert await s.registrations() == before
    assert await metric(s, 'conveyor_registration_syncs_total{mode="push",result="skipped"}') == 1


async def test_the_rate_limit_follows_the_live_cluster_knob(events_server: Events) -> None:
    s = events_server
    changed = await s.api(
        "PATCH", "/cluster-settings", json={"event_router_rate_limit_per_workflow_per_minute": 3}
    )
    assert changed.status_code == 200, changed.text
    service = s.server.state.parts.need(EVENTS)

    async def applied() -> bool:
        service.wake()
        return bool(service.settings.rate_limit_per_minute == 3)

    await async_wait_until(applied, timeout=30, what="the knob applied")
    for _ in range(3):
        await s.emit("limited")
    refused: Any = await s.api("POST", "/events", json={"name": "limited"})
    assert refused.status_code == 429


async def patch_event_knob(s: Events, name: str, value: int, applied: Any) -> None:
    """Store a cluster knob and wait until the event service runs with it."""
    changed = await s.api("PATCH", "/cluster-settings", json={name: value})
    assert changed.status_code == 200, changed.text
    service = s.server.state.parts.need(EVENTS)

    async def done() -> bool:
        service.wake()
        return bool(applied(service.settings))

    await async_wait_until(done, timeout=30, what=f"{name} applied")


async def test_the_dispatch_attempts_follow_the_live_cluster_knob(events_server: Events) -> None:
    s = events_server
    # "flaky" fails twice: with the default 5 attempts it is processed on the third…
    first = await s.emit("flaky")
    assert (await s.wait_state(first, "processed"))["event"]["attempts"] == 3
    # …with 2 attempts it is dead-lettered after the second.
    await patch_event_knob(s, "event_router_max_dispatch_attempts", 2, lambda st: st.max_attempts == 2)
    second = await s.emit("flaky")
    body = await s.wait_state(second, "dlq")
    assert body["event"]["dlq_reason"] == "exhausted_retries" and body["event"]["attempts"] == 2


async def test_the_event_payload_limit_follows_the_live_cluster_knob(events_server: Events) -> None:
    s = events_server
    payload = {"blob": "x" * 2000}
    await s.emit("sized", payload)
    await patch_event_knob(s, "event_max_payload_bytes", 1024, lambda st: st.max_payload_bytes == 1024)
    refused: Any = await s.api("POST", "/events", json={"name": "sized", "payload": payload})
    assert refused.status_code == 413 and refused.json()["error"] == "payload_too_large"
    assert "limit is 1024" in refused.json()["detail"]


async def test_the_event_ttl_follows_the_live_cluster_knob(events_server: Events) -> None:
    s = events_server
    service = s.server.state.parts.need(EVENTS)

    async def no_fence(_conn: object) -> None:
        return None

    done = await s.emit("plain")
    await s.wait_state(done, "processed")
    real_clock = service.clock
    service.clock = lambda: real_clock() + timedelta(seconds=120)  # two minutes on
    try:
        await service.cleanup(no_fence)  # the default TTL (7 days) keeps it
        assert (await s.api("GET", f"/events/{done}")).status_code == 200
        await patch_event_knob(s, "event_router_event_ttl_seconds", 60, lambda st: st.ttl_seconds == 60)
        # (The leader's own cleanup, on the same clock, may get there first.)
        await service.cleanup(no_fence)
        assert (await s.api("GET", f"/events/{done}")).status_code == 404
    finally:
        service.clock = real_clock
