"""Guarded status writes: `UPDATE … WHERE status IN (allowed sources)`, so a racing writer cannot win twice.

A write that changes nothing re-reads the row: already at the target is an idempotent no-op
(`already`), anything else is refused, logged and counted.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from prometheus_client import Counter
from sqlalchemy import Table, bindparam, select, update
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.dml import Update

from conveyor.db.tables import jobs, runs
from conveyor.model.states import JOB_TERMINAL, RUN_TERMINAL, Entity, allowed_sources

log = logging.getLogger(__name__)

Applied = Literal["changed", "already", "refused", "missing"]

INVALID_TRANSITIONS = Counter(
    "conveyor_invalid_transitions_total", "Refused status transitions", ["entity", "src", "dst"]
)

_TABLES: dict[Entity, Table] = {"run": runs, "job": jobs}

# Called in the same transaction after a run or job moved to a terminal status (the server plugs the
# completion events in here; execution never imports `events`).
TerminalHook = Callable[[AsyncConnection, str, str, str], Awaitable[None]]
TERMINAL_HOOKS: list[TerminalHook] = []
TERMINAL_STATUSES: dict[str, frozenset[str]] = {
    "run": frozenset(RUN_TERMINAL),
    "job": frozenset(JOB_TERMINAL),
}


async def transition(
    conn: AsyncConnection,
    entity: Entity,
    row_id: str,
    dst: str,
    *,
    only_from: set[str] | None = None,
    **values: Any,
) -> Applied:
    """Move a run or job to `dst` if the state machine allows it from its current status.

    `only_from` narrows the allowed sources further (e.g. a cancel that must not touch `running`).
    """
    applied, _ = await _apply(conn, entity, row_id, dst, only_from, values, returning=False)
    return applied


async def transition_returning(
    conn: AsyncConnection,
    entity: Entity,
    row_id: str,
    dst: str,
    *,
    only_from: set[str] | None = None,
    **values: Any,
) -> tuple[Applied, dict[str, Any] | None]:
    """`transition`, plus the whole row as written when it changed (`UPDATE … RETURNING`): the caller
    that needs the row next saves the read."""
    return await _apply(conn, entity, row_id, dst, only_from, values, returning=True)


def guard_sources(entity: Entity, dst: str, only_from: set[str] | None = None) -> tuple[str, ...]:
    """The statuses a guarded write to `dst` may change, sorted: the state machine's, narrowed by
    `only_from` (pure)."""
    sources = set(allowed_sources(entity, dst))
    if only_from is not None:
        sources &= only_from
    return tuple(sorted(sources))


@functools.lru_cache(maxsize=512)
def _guarded_update(
    entity: Entity, dst: str, sources: tuple[str, ...], names: tuple[str, ...], returning: bool
) -> Update:
    """The guarded `UPDATE` of one shape, built once: building a statement and its cache key costs more
    Python time than SQLAlchemy's execution of an already compiled one, and transitions run on every
    dispatch and every job's end. The row id and the written values are bound parameters."""
    table = _TABLES[entity]
    values: dict[str, Any] = {"status": dst}
    for name in names:
        values[name] = bindparam(f"new_{name}", type_=table.c[name].type)
    statement = (
        update(table).where(table.c.id == bindparam("row_id"), table.c.status.in_(sources)).values(**values)
    )
    return statement.returning(*table.c) if returning else statement


async def _apply(
    conn: AsyncConnection,
    entity: Entity,
    row_id: str,
    dst: str,
    only_from: set[str] | None,
    values: dict[str, Any],
    *,
    returning: bool,
) -> tuple[Applied, dict[str, Any] | None]:
    sources = guard_sources(entity, dst, only_from)
    statement = _guarded_update(entity, dst, sources, tuple(sorted(values)), returning)
    parameters = {"row_id": row_id, **{f"new_{name}": value for name, value in values.items()}}
    row: dict[str, Any] | None = None
    if returning:
        found = (await conn.execute(statement, parameters)).first()
        changed = found is not None
        row = dict(found._mapping) if found is not None else None
    else:
        changed = (await conn.execute(statement, parameters)).rowcount == 1
    if changed:
        await after_change(conn, entity, row_id, dst)
        return "changed", row
    return await unchanged(conn, entity, row_id, dst), None


async def after_change(conn: AsyncConnection, entity: Entity, row_id: str, dst: str) -> None:
    """What follows a guarded write that changed the row: the terminal hooks, when `dst` is terminal.

    For callers that write the status by a statement of their own (the hand-written hot path)."""
    if dst in TERMINAL_STATUSES[entity]:
        for hook in list(TERMINAL_HOOKS):
            await hook(conn, entity, row_id, dst)
        if entity == "job":
            # A summoning job's end cancels what it summoned (docs/design/execution.md §8.6); lazily, since
            # the cancel itself writes transitions through this module.
            from conveyor.execution.summons import cancel_summons_of

            await cancel_summons_of(conn, row_id, dst)


async def unchanged(conn: AsyncConnection, entity: Entity, row_id: str, dst: str) -> Applied:
    """Why a guarded write to `dst` changed nothing: the row is already there, missing, or refused
    (logged and counted)."""
    table = _TABLES[entity]
    current = (await conn.execute(select(table.c.status).where(table.c.id == row_id))).scalar_one_or_none()
    if current is None:
        return "missing"
    if current == dst:
        return "already"
    INVALID_TRANSITIONS.labels(entity, current, dst).inc()
    log.info("refused %s %s transition %s -> %s", entity, row_id, current, dst)
    return "refused"
