"""The dispatcher after its claim committed: a transient database error while building the dispatch.

The claim is a committed row; if building the `job.dispatch` (the job's rows, its secrets) fails,
nothing reaches the agent and, before issue 17, the job waited out the ack deadline and counted as
the agent's ack timeout (a second dispatch, an extra `dispatch_history` row). A transient error is
retried; a lasting one gives the claim back at once.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.db.engine import Database
from conveyor.db.tables import dispatch_history, dispatch_queue
from conveyor.execution.dispatcher import Dispatcher, Refused, Resolved
from conveyor.execution.queue import AgentSlot
from conveyor.model.protocol import JobDispatch
from tests.support.queued import queue_job


class Serialisation(Exception):
    sqlstate = "40001"


class FlakyResources:
    """Resolves every job, after failing the first `failures` calls as the database would."""

    def __init__(self, failures: int, error: Exception) -> None:
        self.failures = failures
        self.error = error
        self.calls = 0

    async def resolve(
        self, conn: AsyncConnection, run: dict[str, Any], job: dict[str, Any]
    ) -> Resolved | Refused:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return Resolved(env={}, secrets={}, clone_url="file:///repo", auth_header=None)


class Link:
    agent_id = "agent-1"

    def __init__(self) -> None:
        self.offered: list[JobDispatch] = []

    def free_slot(self) -> AgentSlot | None:
        return None if self.offered else AgentSlot(self.agent_id, ("linux",), ())

    def idle_since(self) -> float:
        return 0.0

    def bound_job_id(self) -> str | None:
        return None

    async def offer(self, dispatch: JobDispatch) -> bool:
        self.offered.append(dispatch)
        return True


def dispatcher(database: Database, resources: FlakyResources, link: Link) -> Dispatcher:
    async def ack_timeout_ms() -> int:
        return 10_000

    made = Dispatcher(
        db=database,
        resources=resources,
        owner=lambda: "node-a",
        ack_timeout_ms=ack_timeout_ms,
        max_attempts=5,
        poll_s=60,
        log_max_bytes=1_000_000,
    )
    made.agents[link.agent_id] = link
    return made


async def queue_state(database: Database, job_id: str) -> tuple[Any, ...]:
    async with database.read() as conn:
        row = (
            await conn.execute(
                select(dispatch_queue.c.state, dispatch_queue.c.agent_id, dispatch_queue.c.attempts).where(
                    dispatch_queue.c.job_id == job_id
                )
            )
        ).one()
        history = list(await conn.execute(select(dispatch_history.c.outcome)))
    return (*row, [h.outcome for h in history])


async def test_a_transient_error_while_building_a_dispatch_is_retried(database: Database) -> None:
    job_id = await queue_job(database, "linux")
    error = OperationalError("SELECT …", {}, Serialisation())
    resources, link = FlakyResources(2, error), Link()
    assert await dispatcher(database, resources, link).dispatch_round() == 1
    assert [(d.job_id, d.attempt) for d in link.offered] == [(job_id, 1)]
    assert await queue_state(database, job_id) == ("claimed", "agent-1", 1, [])


async def test_a_lasting_error_while_building_a_dispatch_gives_the_claim_back_at_once(
    database: Database,
) -> None:
    job_id = await queue_job(database, "linux")
    resources, link = FlakyResources(1, RuntimeError("secret backend down")), Link()
    await dispatcher(database, resources, link).dispatch_round()
    assert link.offered == []
    assert await queue_state(database, job_id) == ("pending", None, 1, ["agent_lost"])
