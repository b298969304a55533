"""Workflow registrations (docs/design/events.md §5): extraction from a lock, replace-all sync, the in-memory
index."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from pydantic import ValidationError
from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.db.dialect import dialect_insert
from conveyor.db.tables import cron_schedules, registration_triggers, workflow_registrations
from conveyor.errors import ConveyorError
from conveyor.events.admin_store import source_of_routing_key
from conveyor.events.emit import emit_system
from conveyor.events.models import REGISTERED_KINDS, REGISTRATION_UPDATED, EmitRequest, EventSettings
from conveyor.lockfile import Lock, WorkflowEntry
from conveyor.lockfile.models import (
    EventTriggerEntry,
    JobCompleteTriggerEntry,
    PatternEntry,
    ScheduleTriggerEntry,
    WorkflowCompleteTriggerEntry,
)
from conveyor.model.ids import new_id, utc_now
from conveyor.runtime import store as runtime_store

log = logging.getLogger(__name__)

SyncMode = Literal["push", "manual"]


# The registration kind of a global workflow (docs/design/global_workflows.md §3): the index lists them by
# (org, "global") for the pipeline's evaluation.
GLOBAL_KIND = "global"


def registered_kinds(workflow: WorkflowEntry) -> frozenset[str]:
    """The registered trigger kinds of a workflow, plus `global` for a global one (empty: not a registration)."""
    kinds: set[str] = {t.type for t in workflow.triggers if t.type in REGISTERED_KINDS}
    if is_global(workflow):
        kinds.add(GLOBAL_KIND)
    return frozenset(kinds)


def is_global(workflow: WorkflowEntry) -> bool:
    """A workflow declaring `global_repos` (docs/design/global_workflows.md §2)."""
    return workflow.global_ is not None


def global_refusal(
    routing_key: str, org_id: str, global_sources: Sequence[str], mode: SyncMode
) -> str | None:
    """Why a global workflow of this source may not register, or None when it may
    (docs/design/global_workflows.md §3)."""
    if routing_key not in global_sources:
        return f"{routing_key} is not a policy source of org {org_id} (org-settings global_sources)"
    if mode != "push":
        return (
            "a global workflow registers only from the policy source's default branch (a push or a refresh), "
            "not a manual registration"
        )
    return None


def schedule_key(cron: str, timezone: str) -> str:
    """`cron + "\\n" + timezone`."""
    return f"{cron}\n{timezone}"


def schedules_of(workflow: WorkflowEntry) -> dict[str, tuple[str, str]]:
    """schedule_key → (cron, timezone) of the workflow's schedule triggers."""
    return {
        schedule_key(t.cron, t.timezone): (t.cron, t.timezone)
        for t in workflow.triggers
        if isinstance(t, ScheduleTriggerEntry)
    }


COMPLETION_KINDS = ("workflow_complete", "job_complete")
# Characters that make a glob more than a literal name (wildcards, classes, braces, extglob, escapes).
_GLOB_SYNTAX = frozenset("*?[]{}()!@+|\\")


def literal_name(entry: PatternEntry) -> str | None:
    """The one name a pattern entry admits, when it is a plain case-sensitive glob; else None."""
    if entry.kind != "glob" or entry.flags or entry.negate or _GLOB_SYNTAX.intersection(entry.pattern):
        return None
    return entry.pattern


def completed_workflow_names(workflow: WorkflowEntry, kind: str) -> frozenset[str] | None:
    """The workflow names this workflow's `kind` completion triggers can admit, or None for "any".

    Negated entries only narrow a list, so they are ignored here; a list with no plain positive entry
    (all negations, a wildcard, ignore-case) admits unknown names. The router still matches every
    candidate, so this only has to be a superset.
    """
    names: set[str] = set()
    for trigger in workflow.triggers:
        if (
            not isinstance(trigger, WorkflowCompleteTriggerEntry | JobCompleteTriggerEntry)
            or trigger.type != kind
        ):
            continue
        positives = [e for e in trigger.workflow if not e.negate]
        literals = [literal_name(e) for e in positives]
        if not positives or any(name is None for name in literals):
            return None
        names.update(name for name in literals if name is not None)
    return frozenset(names)


@dataclass(frozen=True)
class Registration:
    """A registration as the router and cron read it."""

    id: str
    org_id: str
    routing_key: str
    repo: str
    workflow_name: str
    entry: WorkflowEntry
    kinds: frozenset[str]
    commit_sha: str | None
    default_branch: str | None
    disabled: bool
    updated_at: datetime


def registration_from_row(row: Mapping[str, Any]) -> Registration:
    """Parse the stored lock entry; raises `ValidationError` when it no longer fits the lock schema."""
    entry = WorkflowEntry.model_validate(row["lock_entry"])
    return Registration(
        id=row["id"],
        org_id=row["org_id"],
        routing_key=row["routing_key"],
        repo=row["repo"],
        workflow_name=row["workflow_name"],
        entry=entry,
        kinds=registered_kinds(entry),
        commit_sha=row["commit_sha"],
        default_branch=row["default_branch"],
        disabled=bool(row["disabled"]),
        updated_at=row["updated_at"],
    )


@dataclass
class RegistrationIndex:
    """Enabled registrations by (org, trigger kind) and by id, each list in id order.

    Built once per registration-table version, so a routing decision is dictionary lookups plus
    matching of the few candidates, whatever the total number of registrations.
    """

    by_kind: dict[tuple[str, str], list[Registration]] = field(default_factory=dict)
    by_id: dict[str, Registration] = field(default_factory=dict)
    by_kind_any_org: dict[str, list[Registration]] = field(default_factory=dict)
    by_event_name: dict[tuple[str, str], list[Registration]] = field(default_factory=dict)
    # Completion triggers by (org, kind, completed workflow name), plus those admitting any name.
    by_completed_workflow: dict[tuple[str, str, str], list[Registration]] = field(default_factory=dict)
    completion_any: dict[tuple[str, str], list[Registration]] = field(default_factory=dict)
    invalid: dict[str, str] = field(default_factory=dict)

    @classmethod
    def build(
        cls, registrations: Iterable[Registration], invalid: Mapping[str, str] | None = None
    ) -> RegistrationIndex:
        """Index enabled registrations (disabled ones stay reachable by id only)."""
        index = cls(invalid=dict(invalid or {}))
        for registration in sorted(registrations, key=lambda r: r.id):
            index.by_id[registration.id] = registration
            if registration.disabled:
                continue
            for kind in registration.kinds:
                index.by_kind.setdefault((registration.org_id, kind), []).append(registration)
                index.by_kind_any_org.setdefault(kind, []).append(registration)
            for name in sorted(
                {t.name for t in registration.entry.triggers if isinstance(t, EventTriggerEntry)}
            ):
                index.by_event_name.setdefault((registration.org_id, name), []).append(registration)
            for kind in COMPLETION_KINDS:
                if kind not in registration.kinds:
                    continue
                names = completed_workflow_names(registration.entry, kind)
                if names is None:
                    index.completion_any.setdefault((registration.org_id, kind), []).append(registration)
                    continue
                for name in sorted(names):
                    key = (registration.org_id, kind, name)
                    index.by_completed_workflow.setdefault(key, []).append(registration)
        return index

    def candidates(
        self, org_id: str, kind: str, name: str | None = None, workflow: str | None = None
    ) -> list[Registration]:
        """Enabled registrations of `org_id` with a trigger of `kind`, in id order: for `event` only
        those naming `name`; for a completion of `workflow`, only those whose trigger can admit it."""
        if kind == "event" and name is not None:
            return self.by_event_name.get((org_id, name), [])
        if kind in COMPLETION_KINDS and workflow is not None:
            named = self.by_completed_workflow.get((org_id, kind, workflow), [])
            wildcard = self.completion_any.get((org_id, kind), [])
            if not wildcard:
                return named
            if not named:
                return wildcard
            return sorted({r.id: r for r in (*named, *wildcard)}.values(), key=lambda r: r.id)
        return self.by_kind.get((org_id, kind), [])


async def table_version(conn: AsyncConnection) -> tuple[int, Any]:
    """(row count, latest updated_at): changes whenever a registration is added, changed or removed."""
    row = (
        await conn.execute(
            select(func.count(), func.max(workflow_registrations.c.updated_at)).select_from(
                workflow_registrations
            )
        )
    ).one()
    return int(row[0]), row[1]


async def load_index(conn: AsyncConnection) -> RegistrationIndex:
    """Every registration, parsed; rows whose lock entry fails the schema are kept aside as invalid."""
    parsed: list[Registration] = []
    invalid: dict[str, str] = {}
    for row in await conn.execute(select(workflow_registrations)):
        try:
            parsed.append(registration_from_row(dict(row._mapping)))
        except ValidationError as exc:
            invalid[row.id] = (
                f"stored lock entry of {row.workflow_name} is invalid: {exc.error_count()} error(s)"
            )
    return RegistrationIndex.build(parsed, invalid)


class IndexCache:
    """The process's registration index, rebuilt when the table version changes."""

    def __init__(self) -> None:
        self._version: tuple[int, Any] | None = None
        self._index = RegistrationIndex()

    async def get(self, conn: AsyncConnection) -> RegistrationIndex:
        """The current index (one cheap version query, a rebuild only after a change)."""
        version = await table_version(conn)
        if version != self._version:
            self._index = await load_index(conn)
            self._version = version
        return self._index


@dataclass(frozen=True)
class SyncResult:
    """What a sync changed."""

    created: list[str]
    updated: list[str]
    removed: list[str]
    skipped_global: list[dict[str, str]]


async def replace_all(
    conn: AsyncConnection,
    *,
    org_id: str,
    routing_key: str,
    repo: str,
    lock: Lock,
    commit_sha: str | None,
    default_branch: str | None,
    prune: bool,
    mode: SyncMode,
    settings: EventSettings,
    only: Sequence[str] | None = None,
    global_sources: Sequence[str] = (),
) -> SyncResult:
    """Upsert this (routing key, repo)'s registered workflows; with `prune`, delete names the lock no longer has.

    Survivors keep their id, `created_at` and `disabled`, so cron history and batch windows survive. A global
    workflow registers only from a policy source (`global_sources`) by a push sync; otherwise it is left out
    and listed in `skipped_global` with the reason (docs/design/global_workflows.md §3).
    """
    now = utc_now()
    c = workflow_registrations.c
    existing = {
        r.workflow_name: r.id
        for r in await conn.execute(
            select(c.id, c.workflow_name).where(c.routing_key == routing_key, c.repo == repo)
        )
    }
    wanted = {w.name: w for w in lock.workflows if registered_kinds(w) and (only is None or w.name in only)}
    skipped_global: list[dict[str, str]] = []
    for name, workflow in sorted(wanted.items()):
        refusal = global_refusal(routing_key, org_id, global_sources, mode) if is_global(workflow) else None
        if refusal is not None:
            skipped_global.append({"workflow": name, "reason": refusal})
            del wanted[name]
    if skipped_global:
        log.warning("registrations of %s: global workflows refused: %s", routing_key, skipped_global)
    created: list[str] = []
    updated: list[str] = []
    for name, workflow in sorted(wanted.items()):
        values = {
            "org_id": org_id,
            "lock_entry": workflow.model_dump(mode="json", by_alias=True),
            "source_file": workflow.source.file,
            "content_hash": workflow.content_hash,
            "commit_sha": commit_sha,
            "default_branch": default_branch,
            "is_global": is_global(workflow),
            "updated_at": now,
        }
        registration_id = existing.get(name)
        if registration_id is not None:
            await conn.execute(update(workflow_registrations).where(c.id == registration_id).values(**values))
            updated.append(name)
        else:
            registration_id = new_id()
            await conn.execute(
                insert(workflow_registrations).values(
                    id=registration_id,
                    routing_key=routing_key,
                    repo=repo,
                    workflow_name=name,
                    disabled=False,
                    created_at=now,
                    **values,
                )
            )
            created.append(name)
        await _sync_children(conn, registration_id, workflow, now)
    removed: list[str] = []
    if prune:
        for name, registration_id in sorted(existing.items()):
            if name not in wanted:
                await conn.execute(delete(workflow_registrations).where(c.id == registration_id))
                removed.append(name)
    result = SyncResult(created, updated, removed, skipped_global)
    await emit_system(
        conn,
        EmitRequest(
            name=REGISTRATION_UPDATED,
            origin="system",
            org_id=org_id,
            payload={
                "routing_key": routing_key,
                "repo": repo,
                "mode": mode,
                "commit_sha": commit_sha,
                "workflows": sorted(wanted),
                "removed": removed,
                "skipped_global": skipped_global,
            },
            source_routing_key=routing_key,
            source_repo=repo,
        ),
        settings,
    )
    return result


class UnknownRoutingKey(ConveyorError, LookupError):
    """No source has the routing key a manual registration names."""


async def register_manual(
    conn: AsyncConnection,
    *,
    routing_key: str,
    repo: str,
    lock: Lock,
    commit_sha: str | None,
    default_branch: str | None,
    only: Sequence[str] | None,
    settings: EventSettings,
) -> SyncResult:
    """A manual registration (`registration register-manual`): the lock's registered workflows upserted for
    (routing key, repo), the repo's other rows kept. The admin route and the direct-database mode both write
    through here (docs/design/events.md §7), so the two leave the same rows."""
    source = await source_of_routing_key(conn, routing_key)
    if source is None:
        raise UnknownRoutingKey(f"source with routing key {routing_key} not found")
    return await replace_all(
        conn,
        org_id=source.org_id,
        routing_key=routing_key,
        repo=repo,
        lock=lock,
        commit_sha=commit_sha,
        default_branch=default_branch or source.default_branch,
        prune=False,
        mode="manual",
        settings=settings,
        only=only,
        global_sources=await global_sources_for(conn, source.org_id, lock),
    )


async def global_sources_for(conn: AsyncConnection, org_id: str, lock: Lock) -> tuple[str, ...]:
    """The org's policy sources, read only when the lock has a global workflow to decide
    (docs/design/global_workflows.md §3): a sync of an ordinary lock reads nothing more than before."""
    if not any(is_global(workflow) for workflow in lock.workflows):
        return ()
    row = await runtime_store.read_org_settings(conn, org_id)
    return row.global_sources if row is not None else ()


async def _sync_children(
    conn: AsyncConnection, registration_id: str, workflow: WorkflowEntry, now: datetime
) -> None:
    """Trigger kinds replaced; schedules: new keys armed now, undeclared keys deleted, kept keys untouched."""
    await conn.execute(
        delete(registration_triggers).where(registration_triggers.c.registration_id == registration_id)
    )
    for kind in sorted(registered_kinds(workflow)):
        await conn.execute(insert(registration_triggers).values(registration_id=registration_id, kind=kind))
    declared = schedules_of(workflow)
    s = cron_schedules.c
    current = {
        r
        for r in (
            await conn.execute(select(s.schedule_key).where(s.registration_id == registration_id))
        ).scalars()
    }
    for key in current - set(declared):
        await conn.execute(
            delete(cron_schedules).where(s.registration_id == registration_id, s.schedule_key == key)
        )
    for key, (cron, timezone) in declared.items():
        await conn.execute(
            dialect_insert(conn, cron_schedules)
            .values(
                registration_id=registration_id, schedule_key=key, cron=cron, timezone=timezone, armed_at=now
            )
            .on_conflict_do_nothing(index_elements=["registration_id", "schedule_key"])
        )


async def delete_registration(conn: AsyncConnection, registration_id: str, settings: EventSettings) -> bool:
    """Remove one registration (triggers, schedules, fires and window cascade) and emit `delete`."""
    c = workflow_registrations.c
    row = (await conn.execute(select(workflow_registrations).where(c.id == registration_id))).first()
    if row is None:
        return False
    await conn.execute(delete(workflow_registrations).where(c.id == registration_id))
    await emit_system(
        conn,
        EmitRequest(
            name=REGISTRATION_UPDATED,
            origin="system",
            org_id=row.org_id,
            payload={
                "routing_key": row.routing_key,
                "repo": row.repo,
                "mode": "delete",
                "commit_sha": row.commit_sha,
                "workflows": [],
                "removed": [row.workflow_name],
                "skipped_global": [],
            },
            source_routing_key=row.routing_key,
            source_repo=row.repo,
        ),
        settings,
    )
    return True


async def set_disabled(conn: AsyncConnection, registration_id: str, disabled: bool) -> bool:
    """Enable or disable; enabling re-arms schedules (`armed_at = now`)."""
    now = utc_now()
    c = workflow_registrations.c
    result = await conn.execute(
        update(workflow_registrations)
        .where(c.id == registration_id)
        .values(disabled=disabled, updated_at=now)
    )
    if result.rowcount != 1:
        return False
    if not disabled:
        await conn.execute(
            update(cron_schedules)
            .where(cron_schedules.c.registration_id == registration_id)
            .values(armed_at=now)
        )
    return True
