"""Cron on both databases with an injected clock: never in the minute of registration, once per slot."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import select, update

from conveyor.db.tables import cron_fires, cron_schedules, events
from conveyor.events.cron import prune_fires, tick
from conveyor.events.metrics import EventMetrics
from conveyor.events.startup import EVENTS
from tests.integration.events.conftest import CI_WORKFLOW, Events, rewrite

NIGHTLY = """
from conveyor import schedule, workflow

nightly = workflow("nightly", on=[schedule("0 2 * * *")])

@nightly.job(runs_on=["linux"])
def run(ctx):
    ctx.sh(["echo", "nightly"])
"""


async def no_fence(_conn: Any) -> None:
    return None


async def test_a_schedule_fires_once_per_slot_and_never_when_new(events_server: Events) -> None:
    s = events_server
    rewrite(s.repo, {"ci": CI_WORKFLOW, "nightly": NIGHTLY})
    await s.add_source()
    await s.push()
    db = s.server.state.db
    settings = s.server.state.parts.need(EVENTS).settings
    metrics = EventMetrics()
    async with db.transaction() as conn:
        armed = (await conn.execute(select(cron_schedules.c.armed_at))).scalar_one()
        # Pretend it was registered at 10:00 of some day.
        ten = armed.replace(hour=10, minute=0, second=0, microsecond=0)
        await conn.execute(update(cron_schedules).values(armed_at=ten))
    assert (
        await tick(db, settings, metrics, no_fence, ten + timedelta(hours=1)) == 0
    )  # 02:00 was before arming
    next_day = ten.replace(hour=2) + timedelta(days=1, seconds=20)
    assert await tick(db, settings, metrics, no_fence, next_day) == 1
    assert await tick(db, settings, metrics, no_fence, next_day + timedelta(seconds=15)) == 0
    # A second "leader" ticking the same slot (a takeover mid-slot) fires nothing more.
    other = EventMetrics()
    assert await tick(db, settings, other, no_fence, next_day + timedelta(seconds=30)) == 0
    # Three days down: only the latest slot fires, two are counted as skipped.
    later = next_day + timedelta(days=3)
    assert await tick(db, settings, metrics, no_fence, later) == 1
    assert metrics.cron_skipped._value.get() == 2
    async with db.read() as conn:
        fires = (await conn.execute(select(cron_fires.c.slot_at, cron_fires.c.event_id))).all()
        names = (
            (await conn.execute(select(events.c.name).where(events.c.name == "__schedule_fire")))
            .scalars()
            .all()
        )
    assert len(fires) == 2 and all(f.event_id for f in fires) and len(names) == 2
    fire = (await s.api("GET", "/events", params={"name": "__schedule_fire"})).json()["items"][-1]
    body = await s.wait_state(fire["id"], "processed")
    assert body["event"]["match_outcome"] == "matched" and body["runs"][0]["workflow_name"] == "nightly"

    # Fires older than 30 days go, except each schedule's newest.
    async with db.transaction() as conn:
        assert await prune_fires(conn, later + timedelta(days=31)) == 1
    async with db.read() as conn:
        left = (await conn.execute(select(cron_fires.c.slot_at))).scalars().all()
    assert left == [max(f.slot_at for f in fires)]

    # Disabling then enabling re-arms: no immediate fire for an already-due slot.
    reg = (await s.registrations())[0]
    assert (await s.api("PATCH", f"/registrations/{reg['id']}", json={"disabled": True})).status_code == 200
    assert (await s.api("PATCH", f"/registrations/{reg['id']}", json={"disabled": False})).status_code == 200
    shown = (await s.api("GET", f"/registrations/{reg['id']}")).json()
    assert shown["schedules"][0]["cron"] == "0 2 * * *" and shown["schedules"][0]["last_slot_at"] is not None
