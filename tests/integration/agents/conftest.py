"""Fixtures for agent and queue tests: the in-process app, and runs with queued jobs made as rows."""

from dataclasses import dataclass, field
from datetime import timedelta

from sqlalchemy import insert
from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.db.tables import DEFAULT_ORG, agents, dispatch_queue, jobs, runs
from conveyor.model.ids import new_id, utc_now


@dataclass
class MadeRun:
    """A run and its jobs by display name."""

    run_id: str
    job_ids: dict[str, str] = field(default_factory=dict)


async def make_run(conn: AsyncConnection, jobs_by_status: dict[str, str], *, number: int = 1) -> MadeRun:
    """A run with one job per `display name -> status`; `queued` jobs get a pending queue row,
    `dispatched` ones a claimed row."""
    now = utc_now()
    made = MadeRun(run_id=new_id())
    await conn.execute(
        insert(runs).values(
            id=made.run_id,
            org_id=DEFAULT_ORG,
            number=number,
            workflow="ci",
            repo="acme/app",
            routing_key="github:acme/app",
            event={},
            status="queued",
            created_at=now,
        )
    )
    for index, (name, status) in enumerate(jobs_by_status.items()):
        job_id = new_id()
        made.job_ids[name] = job_id
        await conn.execute(
            insert(jobs).values(
                id=job_id,
                run_id=made.run_id,
                org_id=DEFAULT_ORG,
                name=name,
                display_name=name,
                status=status,
                runs_on={"labels": [{"kind": "exact", "pattern": "linux", "flags": ""}], "exclude": []},
                created_at=now,
            )
        )
        if status in ("queued", "dispatched"):
            claimed = status == "dispatched"
            await conn.execute(
                insert(dispatch_queue).values(
                    job_id=job_id,
                    run_id=made.run_id,
                    org_id=DEFAULT_ORG,
                    state="claimed" if claimed else "pending",
                    exact_labels=["linux"],
                    runs_on={"labels": [], "exclude": []},
                    enqueued_at=now + timedelta(milliseconds=index),
                    not_before=now,
                    attempts=1 if claimed else 0,
                    agent_id="agent-1" if claimed else None,
                    claimed_at=now if claimed else None,
                )
            )
    return made


async def make_agent(
    conn: AsyncConnection, agent_id: str, labels: list[str], *, state: str = "online"
) -> None:
    """An `agents` row as the endpoint would write it."""
    now = utc_now()
    await conn.execute(
        insert(agents).values(
            agent_id=agent_id,
            org_id=DEFAULT_ORG,
            labels=labels,
            mandatory_labels=[],
            capacity=1,
            hostname=f"{agent_id}.local",
            os="linux",
            arch="x86_64",
            state=state,
            first_seen_at=now,
            connected_at=now,
            last_seen_at=now,
        )
    )
