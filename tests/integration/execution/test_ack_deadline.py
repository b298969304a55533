"""An ack that arrived in time is not an ack timeout, however long it waits to be applied
(docs/design/execution.md §5).

The hub applies an agent's frames one at a time, in order. A `job.ack` can arrive while an earlier
frame of the same agent is still being applied (its transaction waits for a row lock or a pool
connection on a busy node); the ack deadline must not pass judgement on that ack, or the job is
requeued and handed out twice while the agent is already running it.

PostgreSQL only: the slow message is made slow by a row lock the test holds, and SQLite's one
writer would stall the sweep's own write as well.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from conveyor.db.engine import create_sync_engine
from conveyor.model import protocol as p
from tests.support.dispatch_stage import SHORT_ACK_TIMEOUT, SINGLE_WORKFLOW, stage
from tests.support.protocol_agent import ScriptedAgent
from tests.support.repos import commit_all
from tests.support.waiting import async_wait_until

pytestmark = [pytest.mark.slow, pytest.mark.postgres_only]


def rows(database_url: str, sql: str, **params: Any) -> list[Any]:
    engine = create_sync_engine(database_url)
    try:
        with engine.connect() as conn:
            return list(conn.execute(text(sql), params))
    finally:
        engine.dispose()


async def test_an_ack_queued_behind_a_slow_message_is_not_an_ack_timeout(
    postgres_url: str, tmp_path: Path
) -> None:
    with stage(tmp_path, postgres_url, {"ci": SINGLE_WORKFLOW}, SHORT_ACK_TIMEOUT) as s:
        agent = ScriptedAgent(s.ws_url, s.agent_token(["linux"]), capacity=2)
        await agent.connect()
        first_run = s.push()
        first = await agent.next_of(p.JobDispatch)
        await agent.accept(first)
        # Hold the first job's row: the agent's job.finished for it waits on this lock in the hub.
        engine = create_sync_engine(postgres_url)
        holder = engine.connect()
        try:
            holder.execute(text("SELECT id FROM jobs WHERE id = :id FOR UPDATE"), {"id": first.job_id})
            await agent.finish(first.job_id, "success")
            commit_all(s.repo, "second")
            second_run = s.push()
            second = await agent.next_of(p.JobDispatch)
            await agent.accept(second)  # answered at once, but queued behind the locked job.finished
            (deadline,) = rows(
                postgres_url, "SELECT ack_deadline FROM dispatch_queue WHERE job_id = :id", id=second.job_id
            )[0]
            assert deadline is not None

            async def well_past_the_deadline() -> bool:
                (now,) = rows(postgres_url, "SELECT now()")[0]
                return bool((now - deadline).total_seconds() > 3)

            await async_wait_until(well_past_the_deadline, timeout=30, what="the ack deadline long past")
            claimed = rows(
                postgres_url,
                "SELECT state, agent_id, attempts FROM dispatch_queue WHERE job_id = :id",
                id=second.job_id,
            )
            assert [tuple(r) for r in claimed] == [("claimed", agent.agent_id, 1)]
            assert agent.close_code is None
        finally:
            holder.rollback()
            holder.close()
            engine.dispose()
        s.wait_run(first_run, "success")

        async def acked() -> bool:
            found = rows(
                postgres_url, "SELECT ack_deadline FROM dispatch_queue WHERE job_id = :id", id=second.job_id
            )
            return bool(found) and found[0][0] is None

        await async_wait_until(acked, timeout=30, what="the queued ack applied")
        await agent.wait_acked(await agent.finish(second.job_id, "success"))
        s.wait_run(second_run, "success")
        history = rows(postgres_url, "SELECT job_id, attempt, outcome FROM dispatch_history")
        assert sorted((a, o) for _, a, o in history) == [(1, "finished"), (1, "finished")]
        assert agent.close_code is None
        await agent.close()
