"""A delivery's runs of global workflows (docs/design/global_workflows.md §3–§5): the runs the pipeline
creates for the global workflows the events package matched, and the note a policy source's push to another
branch leaves on its delivery."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.db.engine import Database
from conveyor.execution.creation import RunOrigin, create_run
from conveyor.lockfile import Lock
from conveyor.matching import Event

ReportPending = Callable[[AsyncConnection, Any, Event, str, str], Awaitable[None]]


def unregistered_globals(
    lock: Lock, routing_key: str, default_branch: str | None, branch: str | None
) -> list[dict[str, str]]:
    """The global workflows of a push's lock that this push does not register, with the reason: only a
    policy source's default branch registers them (docs/design/global_workflows.md §3)."""
    return [
        {
            "workflow": workflow.name,
            "source": routing_key,
            "reason": f"registered only from the default branch {default_branch}; this push is to {branch}",
        }
        for workflow in lock.workflows
        if workflow.global_ is not None
    ]


def note_unregistered_globals(
    trace: dict[str, Any], lock: Lock, routing_key: str, default_branch: str | None, branch: str | None
) -> None:
    """Add `unregistered_globals` to the delivery's `skipped_global` (nothing when there are none)."""
    refused = unregistered_globals(lock, routing_key, default_branch, branch)
    if refused:
        trace["skipped_global"] = [*trace.get("skipped_global", []), *refused]


def global_trigger_trace(trace: dict[str, Any], match: Any) -> dict[str, Any]:
    """A global run's trigger trace: the event, the candidate's decision, and where the workflow comes from
    (the policy source and its registering commit, which the dispatch checks out)."""
    return {
        "event": trace["event"],
        "workflow": match.trace,
        "global": {
            "source": match.source,
            "registration_id": match.registration_id,
            "commit_sha": match.commit_sha,
            "required": match.required,
        },
    }


async def create_global_runs(
    db: Database,
    gate: asyncio.Semaphore,
    report_pending: ReportPending,
    source: Any,
    origin: RunOrigin,
    event: Event,
    trace: dict[str, Any],
    matched: Sequence[Any],
) -> list[str]:
    """A run per matched global workflow on the triggering delivery (docs/design/global_workflows.md §5):
    named `<policy routing key>/<name>`, reporting on the commit only when required."""
    created: list[str] = []
    for match in matched:
        global_origin = replace(
            origin,
            registration_id=match.registration_id,
            global_source=match.source,
            global_required=match.required,
        )
        async with gate, db.transaction() as conn:
            run = await create_run(
                conn,
                origin=global_origin,
                workflow=match.entry,
                event=event,
                trigger_trace=global_trigger_trace(trace, match),
            )
            if run is not None:
                if match.required:
                    await report_pending(conn, source, event, run.id, run.workflow)
                created.append(run.id)
    return created
