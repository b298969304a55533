"""Two coordinators on one PostgreSQL database share the queue (issue 7 acceptance,
docs/design/execution.md §5).

200 signed webhooks go to two real `conveyor server` processes in turn while scripted agents on both
take the jobs: every run exists once and every job is claimed exactly once. A job running on an
agent connected to coordinator B is then cancelled through coordinator A; the cancel reaches B's
agent through the row state: A's NOTIFY wakes B's hub, which also polls its agents' `cancelling` jobs
every second.

Everything that waits here is async: the scripted agents share this test's event loop, so a
blocking wait would stop them from answering dispatches.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine

from conveyor.model import protocol as p
from tests.fakes.github import FakeGitHub, post_webhook, push_payload
from tests.support.dispatch_stage import FAST, SINGLE_WORKFLOW
from tests.support.processes import ServerProcess
from tests.support.protocol_agent import ScriptedAgent
from tests.support.repos import commit_all, git, make_repo, write_workflows
from tests.support.waiting import async_wait_until

pytestmark = [pytest.mark.slow, pytest.mark.postgres_only, pytest.mark.timeout(300)]

SECRET = "two-coordinators"
SHARED_SECRET_KEY = "1e" * 32
WEBHOOKS = 200
COMMITS = 40
AGENTS_PER_NODE = 3
CAPACITY = 2

HOLD_WORKFLOW = """
from conveyor import push, workflow

hold = workflow("hold", on=[push(branches=["main"])])

@hold.job(runs_on=["hold"])
def wait(ctx):
    ctx.sh(["sleep", "600"])
"""

NODE_ENV = {
    **FAST,
    "CONVEYOR_SECRET_KEY": SHARED_SECRET_KEY,
    # Generous timings: two servers, PostgreSQL and this test share a loaded 2-core machine.
    "CONVEYOR_CLUSTER_LEASE_TTL_MS": "5000",
    "CONVEYOR_CLUSTER_LEASE_RENEW_MS": "500",
    "CONVEYOR_CLUSTER_HEARTBEAT_INTERVAL_MS": "500",
    "CONVEYOR_DISPATCH_ACK_TIMEOUT_MS": "15000",
    "CONVEYOR_AGENT_DEAD_AFTER_MS": "20000",
    "CONVEYOR_RECOVERY_GRACE_MS": "20000",
    "CONVEYOR_SWEEP_INTERVAL_MS": "500",
}


async def autorun(agent: ScriptedAgent, seen: list[str]) -> None:
    """Accept every dispatch and finish it `success` at once; record each job id received."""
    while True:
        dispatch = await agent.next_of(p.JobDispatch, timeout=3600)
        seen.append(dispatch.job_id)
        await agent.accept(dispatch)
        await agent.finish(dispatch.job_id, "success")


def rows(engine: Engine, sql: str) -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execute(text(sql)))


async def test_two_coordinators_share_the_queue_and_a_cancel_crosses_nodes(
    postgres_url: str, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path / "repo", {"ci": SINGLE_WORKFLOW})
    sha = git(repo, "rev-parse", "HEAD")
    started = time.monotonic()
    # One pooled engine for the test's queries: polling with a fresh connection every 50 ms would
    # fork a PostgreSQL backend for each poll on the machine the servers need.
    engine = create_engine(postgres_url.replace("postgresql://", "postgresql+psycopg://", 1), pool_size=2)
    with contextlib.ExitStack() as cleanup, FakeGitHub(repos={"acme/app": repo}) as github:
        cleanup.callback(engine.dispose)
        node_a = ServerProcess(
            tmp_path / "a", database_url=postgres_url, env={**NODE_ENV, "CONVEYOR_INSTANCE_ID": "node-a"}
        )
        node_b = ServerProcess(
            tmp_path / "b", database_url=postgres_url, env={**NODE_ENV, "CONVEYOR_INSTANCE_ID": "node-b"}
        )
        agents: list[ScriptedAgent] = []
        workers: list[asyncio.Task[None]] = []
        try:
            await asyncio.gather(asyncio.to_thread(node_a.wait_ready), asyncio.to_thread(node_b.wait_ready))
            token = node_a.owner_token_or_none() or node_b.owner_token()
            client = httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=30)

            async def api(node: ServerProcess, method: str, path: str, **kwargs: Any) -> httpx.Response:
                return await client.request(method, f"{node.url}/api/v1/admin{path}", **kwargs)

            source = await api(
                node_a,
                "POST",
                "/sources",
                json=github.source_body("acme/app", SECRET),
            )
            assert source.status_code == 201, source.text
            source_id = source.json()["id"]

            async def agent_token(labels: list[str]) -> str:
                answer = await api(node_a, "POST", "/agent-tokens", json={"labels": labels})
                assert answer.status_code == 201, answer.text
                return str(answer.json()["token"])

            seen: dict[str, list[str]] = {"node-a": [], "node-b": []}
            for node, name in ((node_a, "node-a"), (node_b, "node-b")):
                for _ in range(AGENTS_PER_NODE):
                    agent = ScriptedAgent(
                        node.url.replace("http://", "ws://") + "/ws",
                        await agent_token(["linux"]),
                        capacity=CAPACITY,
                        heartbeat_s=2,
                    )
                    await agent.connect()
                    agents.append(agent)
                    workers.append(asyncio.create_task(autorun(agent, seen[name])))

            # 40 commits, 5 pushes of each: runs on one commit share its status report rows.
            commits = [sha]
            for index in range(1, COMMITS):
                git(repo, "commit", "-q", "--allow-empty", "-m", f"change {index}")
                commits.append(git(repo, "rev-parse", "HEAD"))
            gate = asyncio.Semaphore(8)
            redelivered: list[int] = []

            async def deliver(index: int) -> int:
                node = (node_a, node_b)[index % 2]
                after = commits[index % COMMITS]
                payload = {
                    "ref": "refs/heads/main",
                    "before": "0" * 40,
                    "after": after,
                    "repository": {"full_name": "acme/app", "default_branch": "main"},
                    "sender": {"login": "octocat"},
                    "head_commit": {
                        "id": after,
                        "message": "change",
                        "added": [],
                        "modified": [],
                        "removed": [],
                    },
                    "commits": [],
                }
                async with gate:
                    for attempt in range(3):
                        answer = await asyncio.to_thread(
                            post_webhook,
                            f"{node.url}/webhooks/{source_id}",
                            SECRET,
                            "push",
                            payload,
                            f"delivery-{index}",
                        )
                        if answer.status_code < 500:
                            break
                        # A server error is redelivered with the same delivery id, as GitHub's
                        # "redeliver" does; it must never make a second run.
                        redelivered.append(index)
                        await asyncio.sleep(1 + attempt)
                return answer.status_code

            codes = await asyncio.gather(*(deliver(i) for i in range(WEBHOOKS)))
            print(f"webhooks redelivered after a server error: {len(redelivered)}")
            assert set(codes) <= {200, 202}, codes

            async def all_ended() -> dict[str, int] | None:
                counts = dict(
                    await asyncio.to_thread(rows, engine, "SELECT status, count(*) FROM runs GROUP BY status")
                )
                ended = sum(n for status, n in counts.items() if status in ("success", "failed", "cancelled"))
                return counts if ended == WEBHOOKS else None

            counts = await async_wait_until(all_ended, timeout=150, what=f"{WEBHOOKS} runs to end")
            failures = await asyncio.to_thread(
                rows, engine, "SELECT status, reason FROM jobs WHERE status <> 'success' LIMIT 5"
            )
            assert counts == {"success": WEBHOOKS}, failures

            # Every delivery made exactly one run; every job was claimed once, by one agent.
            per_delivery = await asyncio.to_thread(
                rows, engine, "SELECT delivery_id, count(*) FROM runs GROUP BY delivery_id"
            )
            assert len(per_delivery) == WEBHOOKS and {n for _, n in per_delivery} == {1}
            history = await asyncio.to_thread(
                rows, engine, "SELECT job_id, attempt, outcome FROM dispatch_history"
            )
            assert len(history) == WEBHOOKS, [h for h in history if h[2] != "finished"]
            assert {(attempt, outcome) for _, attempt, outcome in history} == {(1, "finished")}
            received = seen["node-a"] + seen["node-b"]
            assert len(received) == len(set(received)) == WEBHOOKS
            # Both coordinators dispatched (each claims for its own agents).
            assert seen["node-a"] and seen["node-b"]

            # A job held by an agent on B, cancelled through A.
            write_workflows(repo, {"ci": SINGLE_WORKFLOW, "hold": HOLD_WORKFLOW})
            held_sha = commit_all(repo, "hold")
            holder = ScriptedAgent(
                node_b.url.replace("http://", "ws://") + "/ws",
                await agent_token(["hold"]),
                labels=["hold"],
                heartbeat_s=2,
            )
            await holder.connect()
            agents.append(holder)
            answer = await asyncio.to_thread(
                post_webhook,
                f"{node_a.url}/webhooks/{source_id}",
                SECRET,
                "push",
                push_payload("acme/app", repo, ref="refs/heads/main", before=commits[-1], after=held_sha),
                "delivery-hold",
            )
            assert answer.status_code == 202, answer.text
            dispatch = await holder.next_of(p.JobDispatch)
            await holder.accept(dispatch)

            async def job_status() -> str:
                run = (await api(node_a, "GET", f"/runs/{dispatch.run_id}")).json()
                return str(run["jobs"][0]["status"])

            await async_wait_until(
                lambda: _equals(job_status(), "running"), timeout=30, what="the held job running"
            )
            cancelled_at = time.monotonic()
            answer = await api(node_a, "POST", f"/runs/{dispatch.run_id}/cancel", json={"reason": "cross"})
            assert answer.status_code == 202 and answer.json()["signalled"] == 1, answer.text
            cancel = await holder.next_of(p.JobCancel, timeout=30)
            reached_s = time.monotonic() - cancelled_at
            assert cancel.job_id == dispatch.job_id
            # A's NOTIFY on conveyor_cancel wakes B's hub at once (its 1 s poll is the fallback);
            # room for a loaded box.
            print(f"cross-node cancel reached node B's agent in {reached_s:.3f}s")
            assert reached_s < 3, f"the cancel took {reached_s:.1f}s to reach node B's agent"
            await holder.wait_acked(await holder.finish(dispatch.job_id, "cancelled", "cancelled_by"))

            async def run_cancelled() -> bool:
                run = (await api(node_a, "GET", f"/runs/{dispatch.run_id}")).json()
                return bool(run["status"] == "cancelled")

            await async_wait_until(run_cancelled, timeout=30, what="the held run cancelled")
            await client.aclose()
        finally:
            for worker in workers:
                worker.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
            for agent in agents:
                with contextlib.suppress(Exception):
                    await agent.close()
            node_a.stop()
            node_b.stop()
    assert time.monotonic() - started < 240


async def _equals(value: Any, expected: Any) -> bool:
    return bool(await value == expected)
