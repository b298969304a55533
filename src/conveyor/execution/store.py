"""SQL reads of runs, jobs and steps for the admin API."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.admin.pagination import keyset_page, next_cursor
from conveyor.db.tables import dispatch_history, job_needs, jobs, runs, step_caches, steps
from conveyor.execution.reroutes import WORKER_AGENT_PREFIX, reroute_entries
from conveyor.model.states import HOOKS_JOB, RUN_TERMINAL, JobEnd, ended_because

RUN_LIST_COLUMNS = tuple(c for c in runs.c if c.name not in ("workflow_lock", "trigger_trace", "event"))


async def job_status(conn: AsyncConnection, run_id: str, job_id: str) -> str | None:
    """The status of a run's job, or None when the run has no such job."""
    return (
        await conn.execute(select(jobs.c.status).where(jobs.c.id == job_id, jobs.c.run_id == run_id))
    ).scalar_one_or_none()


async def dispatched_by_failure_lifecycle(conn: AsyncConnection, run_id: str) -> bool:
    """Whether a failure-lifecycle (`workflows_failed_batch`) trigger dispatched a run (False for none)."""
    found = await conn.execute(select(runs.c.dispatched_by_failure_lifecycle).where(runs.c.id == run_id))
    return bool(found.scalar_one_or_none())


async def mark_dispatched_by_failure_lifecycle(conn: AsyncConnection, run_id: str) -> None:
    """Record that a failure-lifecycle trigger dispatched this run: its own failure is neither buffered nor
    dispatched (docs/design/events.md, the router's steps)."""
    await conn.execute(update(runs).where(runs.c.id == run_id).values(dispatched_by_failure_lifecycle=True))


def ref_candidates(ref: str) -> list[str]:
    """The stored refs a `ref` filter matches: a full `refs/…` name as given; `main` also as a branch or tag."""
    if ref.startswith("refs/"):
        return [ref]
    return [ref, f"refs/heads/{ref}", f"refs/tags/{ref}"]


async def latest_finished_run(
    conn: AsyncConnection, *, source_id: str, workflow: str, ref: str | None
) -> dict[str, Any] | None:
    """The status and reason of a workflow's newest finished run of a source (on `ref` when given), or None.

    Newest by creation, not by finish: a slow run of an older commit ending late does not replace the
    newer commit's result (a status badge, docs/design/execution.md §11).
    """
    query = (
        select(runs.c.status, runs.c.reason)
        .where(
            runs.c.source_id == source_id,
            runs.c.workflow == workflow,
            runs.c.status.in_(sorted(RUN_TERMINAL)),
        )
        .order_by(runs.c.created_at.desc(), runs.c.id.desc())
        .limit(1)
    )
    if ref is not None:
        query = query.where(runs.c.ref.in_(ref_candidates(ref)))
    row = (await conn.execute(query)).first()
    return dict(row._mapping) if row else None


async def page_runs(
    conn: AsyncConnection, *, filters: Mapping[str, Any], limit: int, cursor: str | None
) -> tuple[list[dict[str, Any]], str | None]:
    """Runs newest first, filtered by status, workflow, routing key, ref and time."""
    query = select(*RUN_LIST_COLUMNS)
    for name in ("status", "workflow", "routing_key", "source_id"):
        if filters.get(name) is not None:
            query = query.where(runs.c[name] == filters[name])
    if filters.get("ref") is not None:
        query = query.where(runs.c.ref.in_(ref_candidates(filters["ref"])))
    if filters.get("since") is not None:
        query = query.where(runs.c.created_at >= filters["since"])
    if filters.get("before") is not None:
        query = query.where(runs.c.created_at < filters["before"])
    query = keyset_page(query, runs.c.created_at, runs.c.id, limit=limit, cursor=cursor, filters=filters)
    rows = list((await conn.execute(query)).all())
    following = next_cursor(rows, limit, "created_at", filters)
    items = [dict(r._mapping) for r in rows]
    ended = await ended_jobs_of_runs(
        conn, [r["id"] for r in items if r["status"] in ("failed", "cancelled") and not r["reason"]]
    )
    for item in items:
        item["ended_because"] = ended_because(item["status"], item["reason"], ended.get(item["id"], []))
    return items, following


async def ended_jobs_of_runs(conn: AsyncConnection, run_ids: Sequence[str]) -> dict[str, list[JobEnd]]:
    """The failed, timed-out and cancelled jobs of these runs, by run (what `ended_because` reads)."""
    if not run_ids:
        return {}
    rows = await conn.execute(
        select(jobs.c.run_id, jobs.c.display_name, jobs.c.status, jobs.c.reason, jobs.c.finished_at).where(
            jobs.c.run_id.in_(list(run_ids)), jobs.c.status.in_(["failed", "timed_out", "cancelled"])
        )
    )
    found: dict[str, list[JobEnd]] = {}
    for row in rows:
        found.setdefault(row.run_id, []).append(
            JobEnd(row.display_name, row.status, row.reason, row.finished_at)
        )
    return found


async def get_run(conn: AsyncConnection, run_id: str) -> dict[str, Any] | None:
    """A run's full row."""
    row = (await conn.execute(select(runs).where(runs.c.id == run_id))).first()
    return dict(row._mapping) if row else None


async def jobs_of_run(conn: AsyncConnection, run_id: str) -> list[dict[str, Any]]:
    """A run's jobs in creation order, each with its steps, the job names it `needs` and its `reroutes`."""
    job_rows = [
        dict(r._mapping)
        for r in await conn.execute(
            select(jobs).where(jobs.c.run_id == run_id).order_by(jobs.c.created_at, jobs.c.id)
        )
    ]
    if not job_rows:
        return []
    step_rows = await conn.execute(
        select(steps).where(steps.c.job_id.in_([j["id"] for j in job_rows])).order_by(steps.c.step_index)
    )
    # What each step's caches did (docs/design/caches.md §7), by key.
    caches: dict[tuple[str, int], list[dict[str, Any]]] = {}
    cache_rows = await conn.execute(
        select(step_caches)
        .where(step_caches.c.job_id.in_([j["id"] for j in job_rows]))
        .order_by(step_caches.c.key)
    )
    for cache in cache_rows:
        caches.setdefault((cache.job_id, cache.step_index), []).append(
            {
                "key": cache.key,
                "kind": cache.kind,
                "restored_key": cache.restored_key,
                "saved": cache.saved,
                "saved_size": cache.saved_size,
            }
        )
    by_job: dict[str, list[dict[str, Any]]] = {}
    for step in step_rows:
        by_job.setdefault(step.job_id, []).append(
            {**step._mapping, "caches": caches.get((step.job_id, step.step_index), [])}
        )
    needs: dict[str, list[str]] = {}
    need_rows = await conn.execute(
        select(job_needs.c.job_id, job_needs.c.upstream_name)
        .where(job_needs.c.job_id.in_([j["id"] for j in job_rows]))
        .order_by(job_needs.c.upstream_name)
    )
    for need in need_rows:
        needs.setdefault(need.job_id, []).append(need.upstream_name)
    history: dict[str, list[dict[str, Any]]] = {}
    history_rows = await conn.execute(
        select(dispatch_history).where(
            dispatch_history.c.job_id.in_([j["id"] for j in job_rows]),
            dispatch_history.c.agent_id.startswith(WORKER_AGENT_PREFIX, autoescape=True),
        )
    )
    for row in history_rows:
        history.setdefault(row.job_id, []).append(dict(row._mapping))
    for job in job_rows:
        job["steps"] = by_job.get(job["id"], [])
        job["needs"] = needs.get(job["id"], [])
        job["reroutes"] = reroute_entries(history.get(job["id"], []))
    return job_rows


async def run_ids_of_delivery(conn: AsyncConnection, delivery_id: str) -> list[str]:
    """The runs a delivery created."""
    query = select(runs.c.id).where(runs.c.delivery_id == delivery_id).order_by(runs.c.created_at)
    return [str(r) for r in (await conn.execute(query)).scalars()]


# -- summoned runs (docs/design/execution.md §8.6) --------------------------------------------------------


async def run_of_summon_key(conn: AsyncConnection, key: str) -> dict[str, Any] | None:
    """The run a summon with this `<job_id>:<request_id>` started (a resend's answer)."""
    row = (
        await conn.execute(
            select(
                runs.c.id, runs.c.number, runs.c.workflow, runs.c.status, runs.c.routing_key, runs.c.repo
            ).where(runs.c.summon_key == key)
        )
    ).first()
    return None if row is None else dict(row._mapping)


async def summoned_run(conn: AsyncConnection, run_id: str, job_id: str) -> dict[str, Any] | None:
    """A run `job_id` summoned, with its jobs' outputs by display name (None: not one of its summons)."""
    row = (
        await conn.execute(
            select(
                runs.c.id,
                runs.c.number,
                runs.c.workflow,
                runs.c.status,
                runs.c.reason,
                runs.c.routing_key,
                runs.c.repo,
            ).where(runs.c.id == run_id, runs.c.summoned_by_job_id == job_id)
        )
    ).first()
    if row is None:
        return None
    outputs = {
        job.display_name: job.outputs or {}
        for job in await conn.execute(
            select(jobs.c.display_name, jobs.c.outputs)
            .where(jobs.c.run_id == run_id, jobs.c.name != HOOKS_JOB)
            .order_by(jobs.c.created_at, jobs.c.id)
        )
    }
    return {**dict(row._mapping), "outputs": outputs}


async def unfinished_summons_of_job(conn: AsyncConnection, job_id: str) -> list[str]:
    """The runs a job summoned that have not ended (a cancel follows its end)."""
    rows = await conn.execute(
        select(runs.c.id).where(runs.c.summoned_by_job_id == job_id, runs.c.status.not_in(RUN_TERMINAL))
    )
    return [row.id for row in rows]


async def summon_links(conn: AsyncConnection, run: Mapping[str, Any]) -> dict[str, Any]:
    """Both directions of a run's summon links: the run that summoned it and the runs it summoned."""
    summoned_by = None
    if run.get("summoned_by_run_id"):
        parent = (
            await conn.execute(
                select(runs.c.number, runs.c.workflow, runs.c.routing_key).where(
                    runs.c.id == run["summoned_by_run_id"]
                )
            )
        ).first()
        summoned_by = {
            "run_id": run["summoned_by_run_id"],
            "job_id": run.get("summoned_by_job_id"),
            "number": parent.number if parent else None,
            "workflow": parent.workflow if parent else None,
            "routing_key": parent.routing_key if parent else None,
        }
    children = await conn.execute(
        select(
            runs.c.id,
            runs.c.number,
            runs.c.workflow,
            runs.c.status,
            runs.c.routing_key,
            runs.c.summoned_by_job_id,
        )
        .where(runs.c.summoned_by_run_id == run["id"])
        .order_by(runs.c.created_at, runs.c.id)
    )
    summoned = [
        {
            "run_id": c.id,
            "number": c.number,
            "workflow": c.workflow,
            "status": c.status,
            "routing_key": c.routing_key,
            "job_id": c.summoned_by_job_id,
        }
        for c in children
    ]
    return {"summoned_by": summoned_by, "summoned": summoned}


async def summoner_facts(conn: AsyncConnection, job_id: str) -> dict[str, Any] | None:
    """What a summon checks of the summoning job and its run (None: no such job)."""
    row = (
        await conn.execute(
            select(
                jobs.c.id.label("job_id"),
                jobs.c.status.label("job_status"),
                runs.c.id.label("run_id"),
                runs.c.org_id,
                runs.c.routing_key,
                runs.c.source_id,
                runs.c.repo,
                runs.c.sha,
                runs.c.event,
                runs.c.chain_depth,
                runs.c.triggered_by,
            )
            .join(runs, runs.c.id == jobs.c.run_id)
            .where(jobs.c.id == job_id)
        )
    ).first()
    return None if row is None else dict(row._mapping)
