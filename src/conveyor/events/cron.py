"""Cron (docs/design/events.md §6): a leader-only tick firing each (registration, schedule, slot) exactly
once."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadCronError, CroniterBadDateError, CroniterNotAlphaError, croniter
from sqlalchemy import delete, func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.db.dialect import dialect_insert
from conveyor.db.engine import Database
from conveyor.db.tables import cron_fires, cron_schedules, workflow_registrations
from conveyor.errors import ConveyorError
from conveyor.events.emit import emit_in_tx
from conveyor.events.metrics import EventMetrics
from conveyor.events.models import SCHEDULE_FIRE, EmitRequest, EventSettings

log = logging.getLogger(__name__)

MAX_SKIPPED_COUNT = 10_000
FIRE_HISTORY = timedelta(days=30)


class InvalidCron(ConveyorError, ValueError):
    """A malformed expression or an unknown timezone."""


def due_slot(cron: str, timezone: str, now: datetime) -> datetime | None:
    """The latest slot ≤ now (UTC), evaluated in the schedule's timezone; None if it never fires."""
    try:
        zone = ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise InvalidCron(f"unknown timezone {timezone!r}") from exc
    try:
        start = (now.replace(microsecond=0) + timedelta(seconds=1)).astimezone(zone)
        previous = croniter(cron, start, max_years_between_matches=5).get_prev(datetime)
    except (CroniterBadCronError, CroniterNotAlphaError) as exc:
        raise InvalidCron(f"malformed cron {cron!r}: {exc}") from exc
    except CroniterBadDateError:
        return None
    return previous.astimezone(UTC)


def next_slot(cron: str, timezone: str, now: datetime) -> datetime | None:
    """The first slot after `now` (UTC); None for an invalid or impossible schedule."""
    try:
        following = croniter(cron, now.astimezone(ZoneInfo(timezone)), max_years_between_matches=5).get_next(
            datetime
        )
    except (
        CroniterBadCronError,
        CroniterNotAlphaError,
        CroniterBadDateError,
        ZoneInfoNotFoundError,
        ValueError,
    ):
        return None
    return following.astimezone(UTC)


def slots_between(cron: str, timezone: str, after: datetime, until: datetime) -> int:
    """How many slots lie strictly between `after` and `until` (capped), for the skipped counter."""
    iterator = croniter(cron, after.astimezone(ZoneInfo(timezone)))
    count = 0
    while count < MAX_SKIPPED_COUNT:
        slot = iterator.get_next(datetime).astimezone(UTC)
        if slot >= until:
            break
        count += 1
    return count


def should_fire(slot: datetime | None, armed_at: datetime, last_fired_slot: datetime | None) -> bool:
    """Fire only a slot after arming (a new schedule never fires at once) and newer than every fire."""
    if slot is None or slot <= armed_at:
        return False
    return last_fired_slot is None or last_fired_slot < slot


async def tick(
    db: Database,
    settings: EventSettings,
    metrics: EventMetrics,
    fence: Callable[[AsyncConnection], Awaitable[None]],
    now: datetime,
) -> int:
    """One pass over enabled schedules; returns how many fired."""
    s, r, f = cron_schedules.c, workflow_registrations.c, cron_fires.c
    async with db.read() as conn:
        last_fire = (
            select(f.registration_id, f.schedule_key, func.max(f.slot_at).label("last_slot"))
            .group_by(f.registration_id, f.schedule_key)
            .subquery()
        )
        rows = (
            await conn.execute(
                select(
                    s.registration_id,
                    s.schedule_key,
                    s.cron,
                    s.timezone,
                    s.armed_at,
                    r.org_id,
                    r.routing_key,
                    r.repo,
                    r.workflow_name,
                    r.commit_sha,
                    last_fire.c.last_slot,
                )
                .join(workflow_registrations, r.id == s.registration_id)
                .outerjoin(
                    last_fire,
                    (last_fire.c.registration_id == s.registration_id)
                    & (last_fire.c.schedule_key == s.schedule_key),
                )
                .where(r.disabled.is_(False))
            )
        ).all()
    fired = 0
    for row in rows:
        try:
            slot = due_slot(row.cron, row.timezone, now)
        except InvalidCron as exc:
            metrics.cron_fires.labels("invalid").inc()
            log.warning("schedule of registration %s: %s", row.registration_id, exc)
            continue
        last_slot = row.last_slot
        if not should_fire(slot, row.armed_at, last_slot):
            continue
        assert slot is not None
        baseline = max(x for x in (row.armed_at, last_slot) if x is not None)
        skipped = slots_between(row.cron, row.timezone, baseline, slot)
        key_hash = hashlib.sha256(row.schedule_key.encode()).hexdigest()[:16]
        try:
            async with db.transaction() as conn:
                await fence(conn)
                inserted = (
                    await conn.execute(
                        dialect_insert(conn, cron_fires)
                        .values(
                            registration_id=row.registration_id,
                            schedule_key=row.schedule_key,
                            slot_at=slot,
                            fired_at=now,
                        )
                        .on_conflict_do_nothing()
                        .returning(cron_fires.c.slot_at)
                    )
                ).first()
                if inserted is None:
                    metrics.cron_fires.labels("already_fired").inc()
                    continue
                result = await emit_in_tx(
                    conn,
                    EmitRequest(
                        name=SCHEDULE_FIRE,
                        origin="system",
                        org_id=row.org_id,
                        payload={
                            "registration_id": row.registration_id,
                            "workflow_name": row.workflow_name,
                            "repo": row.repo,
                            "routing_key": row.routing_key,
                            "cron": row.cron,
                            "timezone": row.timezone,
                            "slot_at": slot.isoformat(),
                            "commit_sha": row.commit_sha,
                        },
                        source_routing_key=row.routing_key,
                        source_repo=row.repo,
                        dedup_key=f"cron:{row.registration_id}:{key_hash}:{slot.isoformat()}",
                    ),
                    settings,
                )
                await conn.execute(
                    cron_fires.update()
                    .where(
                        f.registration_id == row.registration_id,
                        f.schedule_key == row.schedule_key,
                        f.slot_at == slot,
                    )
                    .values(event_id=result.event_id)
                )
        except Exception:
            metrics.cron_fires.labels("rolled_back").inc()
            raise
        metrics.cron_fires.labels("fired").inc()
        if skipped:
            metrics.cron_skipped.inc(skipped)
        fired += 1
    return fired


async def prune_fires(conn: AsyncConnection, now: datetime) -> int:
    """Delete fires older than 30 days, except each schedule's newest (the exactly-once baseline)."""
    newer = cron_fires.alias("newer")
    f = cron_fires.c
    has_newer = (
        select(newer.c.slot_at)
        .where(
            newer.c.registration_id == f.registration_id,
            newer.c.schedule_key == f.schedule_key,
            newer.c.slot_at > f.slot_at,
        )
        .exists()
    )
    result = await conn.execute(delete(cron_fires).where(f.fired_at < now - FIRE_HISTORY, has_newer))
    return int(result.rowcount)
