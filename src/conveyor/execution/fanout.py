"""Fan-out (docs/design/execution.md §13): a job that runs once on every connected agent its labels match, as
one job with one result per host.

The decisions are pure: which agents are the hosts (`select_fanout_hosts`) and what the job's result is once
its hosts ended (`fanout_result`). Around them, in the caller's transaction: the candidates read from the
`agents` table, the cap read from `cluster_settings`, and the host executions written (`start_fanout`). The
job's end when its last host ends is `lifecycle.finish_job`'s (it reads `fanout_parent_id` off the row it
ended, so ordinary jobs pay nothing for this).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import insert, select
from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.db.tables import agents, cluster_settings, dispatch_queue, jobs
from conveyor.execution.enqueue import exact_labels_of, pin_label
from conveyor.execution.history import timeline
from conveyor.execution.queue_match import AgentSlot, agent_can_take
from conveyor.execution.transitions import transition
from conveyor.model.ids import new_id
from conveyor.model.knobs import CLUSTER_KNOBS_BY_NAME
from conveyor.model.states import JOB_TERMINAL

MAX_FANOUT_HOSTS = "max_fanout_hosts"


@dataclass(frozen=True)
class FanoutRefusal:
    """Why a fan-out job fails at queue time (its reason)."""

    reason: str


@dataclass(frozen=True)
class HostEnd:
    """One host execution as the fan-out job's result reads it."""

    agent_id: str
    status: str
    reason: str | None


@dataclass
class CapDefault:
    """The configured default of `max_fanout_hosts` (env `CONVEYOR_MAX_FANOUT_HOSTS` or the built-in 10)."""

    value: int = CLUSTER_KNOBS_BY_NAME[MAX_FANOUT_HOSTS].default or 10


DEFAULT_CAP = CapDefault()


def _describe(runs_on: dict[str, Any]) -> str:
    return "[" + ", ".join(m["pattern"] for m in runs_on.get("labels", [])) + "]"


def select_fanout_hosts(
    runs_on: dict[str, Any], candidates: Sequence[AgentSlot], cap: int
) -> tuple[str, ...] | FanoutRefusal:
    """The hosts of a fan-out job (pure): every connected candidate the job's labels match, by agent id.

    None matches, or more than `cap` (`max_fanout_hosts`) do: a refusal, which fails the job at queue time.
    A deploy that silently skipped hosts over the cap would be worse than a visible failure.
    """
    matching = sorted({agent.agent_id for agent in candidates if agent_can_take(runs_on, agent)})
    if not matching:
        return FanoutRefusal(f"fanout_no_hosts: no connected agent matches {_describe(runs_on)}")
    if len(matching) > cap:
        return FanoutRefusal(
            f"fanout_over_cap: {len(matching)} connected agents match {_describe(runs_on)};"
            f" max_fanout_hosts is {cap}"
        )
    return tuple(matching)


def fanout_result(hosts: Sequence[HostEnd]) -> tuple[str, str | None] | None:
    """The fan-out job's status and reason once every host ended (pure); None while one still runs.

    `success` only if every host succeeded (`skipped` by its rules counts as success, as in a run's
    conclusion); else any host `failed` or `timed_out` fails it, naming them; else (a host `cancelled`) it is
    `cancelled`.
    """
    if not hosts or any(host.status not in JOB_TERMINAL for host in hosts):
        return None
    bad = [host for host in hosts if host.status in ("failed", "timed_out")]
    if bad:
        named = "; ".join(f"{host.agent_id}: {host.reason or host.status}" for host in bad)
        return "failed", f"fanout: {len(bad)} of {len(hosts)} hosts failed ({named})"
    if any(host.status == "cancelled" for host in hosts):
        return "cancelled", "fanout: a host was cancelled"
    return "success", None


def host_matrix_key(agent_id: str) -> str:
    """A host execution's `matrix_key`: unique in its run beside its fan-out job, and how `ctx.needs` names it."""
    return f"host={agent_id}"


def pinned_runs_on(runs_on: dict[str, Any], agent_id: str) -> dict[str, Any]:
    """A host execution's queue-row `runs_on`: the job's, pinned to its agent (`queue_match.agent_can_take`)."""
    return {**runs_on, "agent_id": agent_id}


async def fanout_cap(conn: AsyncConnection) -> int:
    """The effective `max_fanout_hosts`, read in the caller's transaction."""
    stored = (
        await conn.execute(
            select(cluster_settings.c[MAX_FANOUT_HOSTS]).where(cluster_settings.c.id == "default")
        )
    ).scalar_one_or_none()
    return int(stored) if stored is not None else DEFAULT_CAP.value


async def connected_candidates(conn: AsyncConnection, org_id: str) -> list[AgentSlot]:
    """The org's connected agents that may host (online, not single-use: an ephemeral agent is its spawn's)."""
    rows = await conn.execute(
        select(agents.c.agent_id, agents.c.labels, agents.c.mandatory_labels).where(
            agents.c.org_id == org_id, agents.c.state == "online", agents.c.ephemeral.is_(False)
        )
    )
    return [AgentSlot(row.agent_id, tuple(row.labels), tuple(row.mandatory_labels)) for row in rows]


async def choose_hosts(
    conn: AsyncConnection, org_id: str, runs_on: dict[str, Any]
) -> tuple[str, ...] | FanoutRefusal:
    """The hosts of a fan-out job about to be queued, or why it fails (reads agents and the cap)."""
    return select_fanout_hosts(runs_on, await connected_candidates(conn, org_id), await fanout_cap(conn))


async def start_fanout(
    conn: AsyncConnection, parent: dict[str, Any], hosts: Sequence[str], now: datetime
) -> list[str]:
    """Write one queued host execution per host, each with its queue row pinned to its agent, and move the
    fan-out job (`queued`) to `running`; the host executions' ids."""
    runs_on: dict[str, Any] = parent["runs_on"]
    created: list[str] = []
    for agent_id in hosts:
        job_id = new_id()
        await conn.execute(
            insert(jobs).values(
                id=job_id,
                run_id=parent["run_id"],
                org_id=parent["org_id"],
                name=parent["name"],
                matrix_key=host_matrix_key(agent_id),
                display_name=f"{parent['display_name']} @ {agent_id}",
                matrix=None,
                status="queued",
                runs_on=runs_on,
                environment=parent.get("environment"),
                concurrency_key=None,
                timeout_ms=parent.get("timeout_ms"),
                created_at=now,
                queued_at=now,
                fanout_parent_id=parent["id"],
                fanout_host=agent_id,
            )
        )
        pinned = pinned_runs_on(runs_on, agent_id)
        await conn.execute(
            insert(dispatch_queue).values(
                job_id=job_id,
                run_id=parent["run_id"],
                org_id=parent["org_id"],
                state="pending",
                exact_labels=sorted({*exact_labels_of(runs_on), pin_label(agent_id)}),
                runs_on=pinned,
                enqueued_at=now,
                not_before=now,
            )
        )
        created.append(job_id)
    await transition(conn, "job", parent["id"], "running", only_from={"queued"}, started_at=now, reason=None)
    await timeline(conn, parent["run_id"], parent["id"], "dispatch", "job.fanout", {"hosts": list(hosts)})
    return created


async def host_ends(conn: AsyncConnection, parent_id: str) -> list[HostEnd]:
    """Every host execution of a fan-out job, as its result reads them."""
    rows = await conn.execute(
        select(jobs.c.fanout_host, jobs.c.status, jobs.c.reason)
        .where(jobs.c.fanout_parent_id == parent_id)
        .order_by(jobs.c.fanout_host)
    )
    return [HostEnd(row.fanout_host, row.status, row.reason) for row in rows]
