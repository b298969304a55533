"""Cron (docs/design/events.md §6): a leader-only tick firing each (registration, schedule, slot) exactly
once."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
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


@dataclass(frozen=True, slots=True)
class Schedule:
    """A schedule of an enabled registration as a tick reads it, with the newest slot it fired."""

    registration_id: str
    schedule_key: str
    cron: str
    timezone: str
    armed_at: datetime
    org_id: str
    routing_key: str
    repo: str
    workflow_name: str
    commit_sha: str | None
    last_slot: datetime | None


@dataclass(frozen=True, slots=True)
class Fire:
    """A slot a schedule owes: the event it emits and how many slots were missed before it."""

    schedule: Schedule
    slot: datetime
    skipped: int
    request: EmitRequest


def plan_fire(schedule: Schedule, now: datetime) -> Fire | None:
    """The fire `schedule` owes at `now`, or None. Catching up after downtime fires only the latest due
    slot; the ones missed since the last fire (or arming) are counted, not fired. `InvalidCron` for a
    malformed expression or timezone."""
    slot = due_slot(schedule.cron, schedule.timezone, now)
    if slot is None or not should_fire(slot, schedule.armed_at, schedule.last_slot):
        return None
    baseline = max(x for x in (schedule.armed_at, schedule.last_slot) if x is not None)
    return Fire(
        schedule=schedule,
        slot=slot,
        skipped=slots_between(schedule.cron, schedule.timezone, baseline, slot),
        request=fire_request(schedule, slot),
    )


def fire_request(schedule: Schedule, slot: datetime) -> EmitRequest:
    """The `__schedule_fire` event of one slot; its dedup key makes a second emit of the slot a replay."""
    key_hash = hashlib.sha256(schedule.schedule_key.encode()).hexdigest()[:16]
    return EmitRequest(
        name=SCHEDULE_FIRE,
        origin="system",
        org_id=schedule.org_id,
        payload={
            "registration_id": schedule.registration_id,
            "workflow_name": schedule.workflow_name,
            "repo": schedule.repo,
            "routing_key": schedule.routing_key,
            "cron": schedule.cron,
            "timezone": schedule.timezone,
            "slot_at": slot.isoformat(),
            "commit_sha": schedule.commit_sha,
        },
        source_routing_key=schedule.routing_key,
        source_repo=schedule.repo,
        dedup_key=f"cron:{schedule.registration_id}:{key_hash}:{slot.isoformat()}",
    )


async def enabled_schedules(conn: AsyncConnection) -> list[Schedule]:
    """Every schedule of an enabled registration, with its newest fired slot."""
    s, r, f = cron_schedules.c, workflow_registrations.c, cron_fires.c
    last_fire = (
        select(f.registration_id, f.schedule_key, func.max(f.slot_at).label("last_slot"))
        .group_by(f.registration_id, f.schedule_key)
        .subquery()
    )
    rows = await conn.execute(
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
            (last_fire.c.registration_id == s.registration_id) & (last_fire.c.schedule_key == s.schedule_key),
        )
        .where(r.disabled.is_(False))
    )
    return [Schedule(**row._mapping) for row in rows]


async def record_fire(conn: AsyncConnection, fire: Fire, now: datetime, settings: EventSettings) -> bool:
    """Claim the slot in `cron_fires` and emit its event, in the caller's (fenced) transaction; False when
    the slot fired already (its row exists)."""
    schedule, f = fire.schedule, cron_fires.c
    inserted = (
        await conn.execute(
            dialect_insert(conn, cron_fires)
            .values(
                registration_id=schedule.registration_id,
                schedule_key=schedule.schedule_key,
                slot_at=fire.slot,
                fired_at=now,
            )
            .on_conflict_do_nothing()
            .returning(cron_fires.c.slot_at)
        )
    ).first()
    if inserted is None:
        return False
    result = await emit_in_tx(conn, fire.request, settings)
    await conn.execute(
        cron_fires.update()
        .where(
            f.registration_id == schedule.registration_id,
            f.schedule_key == schedule.schedule_key,
            f.slot_at == fire.slot,
        )
        .values(event_id=result.event_id)
    )
    return True


async def tick(
    db: Database,
    settings: EventSettings,
    metrics: EventMetrics,
    fence: Callable[[AsyncConnection], Awaitable[None]],
    now: datetime,
) -> int:
    """One pass over enabled schedules, each fire in a transaction of its own; returns how many fired."""
    async with db.read() as conn:
        schedules = await enabled_schedules(conn)
    fired = 0
    for schedule in schedules:
        try:
            fire = plan_fire(schedule, now)
        except InvalidCron as exc:
            metrics.cron_fires.labels("invalid").inc()
            log.warning("schedule of registration %s: %s", schedule.registration_id, exc)
            continue
        if fire is None:
            continue
        try:
            async with db.transaction() as conn:
                await fence(conn)
                recorded = await record_fire(conn, fire, now, settings)
                if not recorded:
                    metrics.cron_fires.labels("already_fired").inc()
        except Exception:
            metrics.cron_fires.labels("rolled_back").inc()
            raise
        if not recorded:
            continue
        metrics.cron_fires.labels("fired").inc()
        if fire.skipped:
            metrics.cron_skipped.inc(fire.skipped)
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
