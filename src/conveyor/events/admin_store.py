"""The SQL of what operators configure, beyond the event store (docs/design/events.md §7, §10): the sources a
route or a dispatch names by routing key, registrations and their schedules, trust grants, notification rules.

The admin routes call these and only these; rows of another package's table (`sources`, owned by `ingest`)
come back as typed dataclasses.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import delete, func, insert, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.admin.pagination import keyset_page, next_cursor
from conveyor.db.tables import (
    cron_fires,
    cron_schedules,
    event_trust,
    notification_rules,
    registration_triggers,
    sources,
    workflow_registrations,
)
from conveyor.events.trust import Grant

# The kinds of source whose registrations come from a default branch's lock file (`registrations refresh`).
GIT_BACKED_KINDS = ("github", "git", "local")

REGISTRATION_COLUMNS = (
    "id",
    "org_id",
    "routing_key",
    "repo",
    "workflow_name",
    "source_file",
    "content_hash",
    "commit_sha",
    "default_branch",
    "is_global",
    "disabled",
    "created_at",
    "updated_at",
)


# --- sources (the `ingest` package's table, read by routing key)


@dataclass(frozen=True)
class SourceTerms:
    """What an events route needs of the source behind a routing key."""

    id: str
    org_id: str
    default_branch: str | None


async def source_of_routing_key(conn: AsyncConnection, routing_key: str) -> SourceTerms | None:
    """The source a routing key names, or None."""
    row = (
        await conn.execute(
            select(sources.c.id, sources.c.org_id, sources.c.default_branch).where(
                sources.c.routing_key == routing_key
            )
        )
    ).first()
    return SourceTerms(row.id, row.org_id, row.default_branch) if row is not None else None


async def git_backed_source_ids(conn: AsyncConnection, routing_key: str | None) -> list[str]:
    """The ids of the enabled sources that read lock files from a branch (only `routing_key`'s when given)."""
    query = select(sources.c.id).where(sources.c.kind.in_(GIT_BACKED_KINDS), sources.c.enabled.is_(True))
    if routing_key is not None:
        query = query.where(sources.c.routing_key == routing_key)
    return list((await conn.execute(query)).scalars())


# --- registrations


async def page_registrations(
    conn: AsyncConnection, *, filters: Mapping[str, Any], limit: int, cursor: str | None
) -> tuple[list[dict[str, Any]], str | None]:
    """Registrations newest first by (created_at, id), filtered by `routing_key`, `repo`, `workflow` and
    `trigger_kind`, each with its sorted `trigger_kinds`; keyset cursor bound to the filters."""
    c = workflow_registrations.c
    query = select(*(c[name] for name in REGISTRATION_COLUMNS))
    if filters.get("routing_key") is not None:
        query = query.where(c.routing_key == filters["routing_key"])
    if filters.get("repo") is not None:
        query = query.where(c.repo == filters["repo"])
    if filters.get("workflow") is not None:
        query = query.where(c.workflow_name == filters["workflow"])
    if filters.get("trigger_kind") is not None:
        query = query.where(
            c.id.in_(
                select(registration_triggers.c.registration_id).where(
                    registration_triggers.c.kind == filters["trigger_kind"]
                )
            )
        )
    query = keyset_page(query, c.created_at, c.id, limit=limit, cursor=cursor, filters=filters)
    rows = list((await conn.execute(query)).all())
    following = next_cursor(rows, limit, "created_at", filters)
    items = [dict(r._mapping) for r in rows]
    kinds: dict[str, set[str]] = {item["id"]: set() for item in items}
    if kinds:
        found = await conn.execute(
            select(registration_triggers.c.registration_id, registration_triggers.c.kind).where(
                registration_triggers.c.registration_id.in_(list(kinds))
            )
        )
        for registration_id, kind in found:
            kinds[registration_id].add(kind)
    for item in items:
        item["trigger_kinds"] = sorted(kinds[item["id"]])
    return items, following


async def get_registration(conn: AsyncConnection, registration_id: str) -> dict[str, Any] | None:
    """The whole registration row, or None."""
    row = (
        await conn.execute(
            select(workflow_registrations).where(workflow_registrations.c.id == registration_id)
        )
    ).first()
    return dict(row._mapping) if row is not None else None


@dataclass(frozen=True)
class ScheduleState:
    """A registration's cron schedule and the last slot it fired."""

    cron: str
    timezone: str
    armed_at: datetime | None
    last_slot_at: datetime | None


async def schedules_of_registration(conn: AsyncConnection, registration_id: str) -> list[ScheduleState]:
    """Every schedule of a registration with its last fired slot."""
    found = []
    rows = await conn.execute(
        select(cron_schedules).where(cron_schedules.c.registration_id == registration_id)
    )
    for schedule in rows:
        last = (
            await conn.execute(
                select(func.max(cron_fires.c.slot_at)).where(
                    cron_fires.c.registration_id == registration_id,
                    cron_fires.c.schedule_key == schedule.schedule_key,
                )
            )
        ).scalar_one_or_none()
        found.append(ScheduleState(schedule.cron, schedule.timezone, schedule.armed_at, last))
    return found


# --- trust grants


async def list_trust(conn: AsyncConnection, *, target_routing_key: str | None) -> list[dict[str, Any]]:
    """Every grant oldest first (only those into `target_routing_key` when given)."""
    query = select(event_trust).order_by(event_trust.c.created_at, event_trust.c.id)
    if target_routing_key is not None:
        query = query.where(event_trust.c.target_routing_key == target_routing_key)
    return [dict(r._mapping) for r in await conn.execute(query)]


async def enabled_grants(conn: AsyncConnection, org_id: str) -> list[Grant]:
    """The org's enabled grants, as the router reads them."""
    t = event_trust.c
    rows = await conn.execute(select(event_trust).where(t.org_id == org_id, t.enabled.is_(True)))
    return [
        Grant(
            id=r.id,
            org_id=r.org_id,
            source_routing_key=r.source_routing_key,
            source_repo=r.source_repo,
            target_routing_key=r.target_routing_key,
            target_repo=r.target_repo,
            event_names=tuple(r.event_names),
        )
        for r in rows
    ]


async def insert_trust(conn: AsyncConnection, row: Mapping[str, Any]) -> bool:
    """Store a grant; False when an identical one exists (the caller's transaction stays usable)."""
    try:
        async with conn.begin_nested():
            await conn.execute(insert(event_trust).values(**row))
    except IntegrityError:
        return False
    return True


async def get_trust(conn: AsyncConnection, grant_id: str) -> dict[str, Any] | None:
    """A grant's row, or None."""
    row = (await conn.execute(select(event_trust).where(event_trust.c.id == grant_id))).first()
    return dict(row._mapping) if row is not None else None


async def delete_trust(conn: AsyncConnection, grant_id: str) -> None:
    """Remove a grant."""
    await conn.execute(delete(event_trust).where(event_trust.c.id == grant_id))


# --- notification rules


@dataclass(frozen=True)
class NotificationRule:
    """A `notification_rules` row."""

    id: str
    org_id: str
    source_id: str | None
    on_events: list[str]
    workflow: str | None
    ref_glob: str | None
    target_kind: str
    target: str
    created_at: datetime
    created_by: str | None


def _rule(row: Any) -> NotificationRule:
    return NotificationRule(**{name: row._mapping[name] for name in NotificationRule.__dataclass_fields__})


async def list_notification_rules(conn: AsyncConnection) -> list[tuple[NotificationRule, str | None]]:
    """Every rule oldest first, with its source's name (None: every source)."""
    t = notification_rules.c
    rows = await conn.execute(
        select(notification_rules, sources.c.name.label("source_name"))
        .outerjoin(sources, sources.c.id == t.source_id)
        .order_by(t.created_at, t.id)
    )
    return [(_rule(r), r.source_name) for r in rows]


async def insert_notification_rule(conn: AsyncConnection, rule: NotificationRule) -> None:
    """Store a rule."""
    await conn.execute(insert(notification_rules).values(**asdict(rule)))


async def delete_notification_rule(conn: AsyncConnection, rule_id: str) -> bool:
    """Remove a rule; False when there is none."""
    t = notification_rules.c
    if (await conn.execute(select(t.id).where(t.id == rule_id))).first() is None:
        return False
    await conn.execute(delete(notification_rules).where(t.id == rule_id))
    return True
