"""The event store on both databases: lease, fenced finish, state SQL = state function, catch-up, guards."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select, update

from conveyor.db.engine import Database
from conveyor.db.tables import events
from conveyor.events import store
from conveyor.events.emit import emit_in_tx
from conveyor.events.metrics import EventMetrics
from conveyor.events.models import EmitRejected, EmitRequest, EventSettings
from conveyor.events.service import EventService
from conveyor.events.state import processing_state, state_expression
from conveyor.model.ids import new_id, utc_now
from tests.support.waiting import async_wait_until

SETTINGS = EventSettings()
JOB_DONE = {
    "run_id": "r",
    "job_id": "j",
    "workflow_name": "ci",
    "job_name": "build",
    "repo": "app",
    "status": "success",
}


def request(name: str = "ping", **overrides: Any) -> EmitRequest:
    values: dict[str, Any] = {
        "name": name,
        "origin": "custom",
        "org_id": "default",
        "source_routing_key": "local:a",
    }
    values.update(overrides)
    return EmitRequest(**values)


async def test_lease_has_one_winner_and_finish_is_fenced(database: Database) -> None:
    async with database.transaction() as conn:
        event_id = (await emit_in_tx(conn, request(), SETTINGS)).event_id
    now = utc_now()
    async with database.transaction() as conn:
        first = await store.take_lease(conn, event_id, "node-a", now, 60)
    async with database.transaction() as conn:
        second = await store.take_lease(conn, event_id, "node-b", now, 60)
    assert first is not None and first["attempts"] == 1 and second is None
    # After expiry another node takes it over; the first node's finish then changes nothing.
    later = now + timedelta(seconds=61)
    async with database.transaction() as conn:
        taken = await store.take_lease(conn, event_id, "node-b", later, 60)
    assert taken is not None and taken["attempts"] == 2
    async with database.transaction() as conn:
        assert not await store.finish(conn, event_id, "node-a", 1, later, "matched", 1)
        assert await store.finish(conn, event_id, "node-b", 2, later, "no-registration", 0)
    async with database.read() as conn:
        row = await store.get_event(conn, event_id)
    assert row is not None and row["match_outcome"] == "no-registration" and row["lease_owner"] is None


async def test_state_sql_agrees_with_the_function_on_edge_rows(database: Database) -> None:
    now = utc_now()
    shapes: list[dict[str, Any]] = [
        {},
        {"attempts": 1},
        {"attempts": 1, "lease_owner": "n", "lease_expires_at": now + timedelta(seconds=30)},
        {"attempts": 1, "lease_owner": "n", "lease_expires_at": now},  # expired lease
        {"attempts": 1, "lease_owner": "n", "lease_expires_at": now - timedelta(seconds=1)},
        {"attempts": 2, "processed_at": now, "match_outcome": "matched", "matched_count": 1},
        {"attempts": 5, "dlq_at": now, "dlq_reason": "exhausted_retries"},
        {"attempts": 0, "dlq_at": None, "last_error": "kept after a DLQ retry"},
        {"attempts": 3, "dlq_at": now, "processed_at": now},
    ]
    ids = []
    async with database.transaction() as conn:
        for shape in shapes:
            event_id = new_id()
            ids.append(event_id)
            await conn.execute(
                events.insert().values(
                    id=event_id,
                    name="x",
                    origin="admin",
                    payload={},
                    created_at=now,
                    **{"attempts": 0, **shape},
                )
            )
    async with database.read() as conn:
        rows = (await conn.execute(select(events, state_expression(now).label("sql_state")))).all()
    assert len(rows) == len(shapes)
    for row in rows:
        assert row.sql_state == processing_state(dict(row._mapping), now), dict(row._mapping)
    assert {row.sql_state for row in rows} == {"pending", "retrying", "leased", "processed", "dlq"}


async def test_rate_limit_rejects_the_101st_custom_emit_but_not_reserved_events(database: Database) -> None:
    async with database.transaction() as conn:
        for _ in range(100):
            await emit_in_tx(conn, request("ping"), SETTINGS)
    async with database.transaction() as conn:
        with pytest.raises(EmitRejected) as refused:
            await emit_in_tx(conn, request("ping"), SETTINGS)
    assert refused.value.code == "rate_limited" and refused.value.status == 429
    assert refused.value.retry_after_ms is not None and 0 < refused.value.retry_after_ms <= 60_000
    async with database.transaction() as conn:
        await emit_in_tx(conn, request("pong"), SETTINGS)  # another name has its own budget
        for number in range(500):
            await emit_in_tx(
                conn,
                request("__job_complete", origin="system", payload=JOB_DONE, dedup_key=f"jc:{number}"),
                SETTINGS,
            )
    async with database.read() as conn:
        counted = (await conn.execute(select(events.c.name))).scalars().all()
    assert counted.count("ping") == 100 and counted.count("__job_complete") == 500


async def test_chain_depth_limit_and_dedup(database: Database) -> None:
    async with database.transaction() as conn:
        first = await emit_in_tx(conn, request(chain_depth=9, dedup_key="emit:j:1"), SETTINGS)
        again = await emit_in_tx(conn, request(chain_depth=9, dedup_key="emit:j:1"), SETTINGS)
        assert first.created and not again.created and again.event_id == first.event_id
        with pytest.raises(EmitRejected) as refused:
            await emit_in_tx(conn, request(chain_depth=10), SETTINGS)
    assert refused.value.code == "chain_depth_exceeded"


async def test_catch_up_processes_a_backlog_with_shared_timestamps_exactly_once(database: Database) -> None:
    shared = datetime(2026, 1, 1, tzinfo=UTC)
    rows = [
        {
            "id": new_id(),
            "name": "bulk",
            "origin": "admin",
            "org_id": "default",
            "payload": {},
            "attempts": 0,
            "created_at": shared if number < 300 else shared + timedelta(milliseconds=number),
        }
        for number in range(1000)
    ]
    async with database.transaction() as conn:
        await conn.execute(events.insert(), rows)
    metrics = EventMetrics()
    service = EventService(database, EventSettings(concurrency=4), owner=lambda: "node-a", metrics=metrics)
    processed = await service.drain()
    assert processed == 1000
    async with database.read() as conn:
        found = (await conn.execute(select(events.c.attempts, events.c.match_outcome))).all()
    assert all(row.attempts == 1 and row.match_outcome == "no-registration" for row in found)
    assert await service.drain() == 0


async def test_stopping_mid_drain_waits_for_every_event_in_flight(database: Database) -> None:
    """A stop must not return while an event is still cleaning up: the engine is disposed right after."""
    async with database.transaction() as conn:
        for _ in range(6):
            await emit_in_tx(conn, request(), SETTINGS)
    service = EventService(
        database, EventSettings(concurrency=6), owner=lambda: "node-a", metrics=EventMetrics()
    )
    started: list[str] = []
    cleaned: list[str] = []
    never = asyncio.Event()

    async def slow_process(event_id: str) -> str | None:
        started.append(event_id)
        try:
            await never.wait()
        except asyncio.CancelledError:
            # Cleanup that takes some turns of the loop, as closing a connection does; the first
            # event finishes at once, the others later.
            for _ in range(20 * started.index(event_id)):
                await asyncio.sleep(0)
            cleaned.append(event_id)
            raise
        return None

    service.process = slow_process  # type: ignore[method-assign]
    await service.start()

    async def all_started() -> bool:
        return len(started) == 6

    await async_wait_until(all_started, what="six events in flight")
    await service.stop()
    assert sorted(cleaned) == sorted(started)


async def test_failures_retry_with_backoff_then_dlq_and_expired_leases_return(database: Database) -> None:
    async with database.transaction() as conn:
        event_id = (await emit_in_tx(conn, request("flaky"), SETTINGS)).event_id
    settings = EventSettings(
        test_fail_first_n={"flaky": 10}, retry_base_seconds=5, retry_max_seconds=300, max_attempts=3
    )
    clock = [utc_now()]
    service = EventService(
        database,
        settings,
        owner=lambda: "node-a",
        metrics=EventMetrics(),
        clock=lambda: clock[0],
        rng=lambda: 1.0,
    )
    assert await service.process(event_id) == "retrying"
    async with database.read() as conn:
        row = await store.get_event(conn, event_id)
    assert row is not None and row["next_retry_at"] == clock[0] + timedelta(seconds=5)
    assert processing_state(row, clock[0]) == "retrying"
    assert await service.process(event_id) is None  # not due yet
    clock[0] += timedelta(seconds=5)
    assert await service.process(event_id) == "retrying"
    clock[0] += timedelta(seconds=10)
    assert await service.process(event_id) == "dlq:exhausted_retries"

    # A lease that lapses is released by the leader scan (or DLQ'd once out of attempts).
    async with database.transaction() as conn:
        other = (await emit_in_tx(conn, request("other"), SETTINGS)).event_id
        await store.take_lease(conn, other, "dead-node", clock[0], 1)

    async def no_fence(_conn: Any) -> None:
        return None

    clock[0] += timedelta(seconds=2)
    await service.scan(no_fence)
    async with database.read() as conn:
        released = await store.get_event(conn, other)
    assert released is not None and released["lease_owner"] is None
    assert released["last_error"] == "lease expired (owner dead-node)"
    assert service.metrics.lease_expirations._value.get() == 1
    assert await service.process(other) == "no-registration"


async def test_a_schedule_fire_without_registration_id_is_dlqd_at_once(database: Database) -> None:
    now = utc_now()
    event_id = new_id()
    async with database.transaction() as conn:
        await conn.execute(
            events.insert().values(
                id=event_id,
                name="__schedule_fire",
                origin="system",
                org_id="default",
                payload={"workflow_name": "x"},
                created_at=now,
                attempts=0,
            )
        )
    service = EventService(database, SETTINGS, owner=lambda: "node-a", metrics=EventMetrics())
    assert await service.process(event_id) == "dlq:non_retryable"

    async def no_fence(_conn: Any) -> None:
        return None

    async with database.transaction() as conn:
        await conn.execute(
            update(events).where(events.c.id == event_id).values(processed_at=now - timedelta(days=30))
        )
    # Even with processed_at set long ago, a DLQ row is never cleaned up.
    await service.cleanup(no_fence, ttl_s=0)
    async with database.read() as conn:
        assert await store.get_event(conn, event_id) is not None
