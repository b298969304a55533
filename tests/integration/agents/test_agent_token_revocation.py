"""Revoking an agent token closes the agents connected with it (docs/design/execution.md §6, close 4010).

A real `conveyor agent` process holds a connection with the revoked token: the DELETE closes it with
4010 and the agent exits 3 without reconnecting, while an agent of another token stays connected. A
revocation the node never heard about (written behind its back, as a node that was down when the
notice went out would be) is caught by the hub's re-check of its connections' tokens.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update

from conveyor.db.engine import create_sync_engine
from conveyor.db.tables import agent_tokens
from conveyor.model import protocol as p
from conveyor.model.ids import utc_now
from tests.support.dispatch_stage import SINGLE_WORKFLOW, Stage, stage
from tests.support.processes import agent_process
from tests.support.protocol_agent import ScriptedAgent
from tests.support.waiting import async_wait_until

pytestmark = pytest.mark.slow

# The revocation notice closes the socket at once; the agent then stops its ready runner and exits.
EXIT_BOUND_S = 30.0


def mint(s: Stage, labels: list[str]) -> tuple[str, str]:
    """A new agent token: (id, plaintext)."""
    answer = s.api("POST", "/agent-tokens", json={"labels": labels})
    assert answer.status_code == 201, answer.text
    return str(answer.json()["id"]), str(answer.json()["token"])


def agents_of_token(s: Stage, token_id: str) -> list[dict[str, Any]]:
    items = s.api("GET", "/agents", params={"limit": 200}).json()["items"]
    return [a for a in items if a.get("token_id") == token_id]


async def test_revoking_a_token_closes_its_agent_with_4010_and_the_agent_exits_3(
    database_url: str, tmp_path: Path
) -> None:
    with stage(tmp_path, database_url, {"ci": SINGLE_WORKFLOW}) as s:
        revoked_id, revoked_token = mint(s, ["linux"])
        _, other_token = mint(s, ["linux"])
        bystander = ScriptedAgent(s.ws_url, other_token, agent_id="bystander")
        await bystander.connect()
        with agent_process(s.ws_url, revoked_token, tmp_path / "agent") as (proc, log_path):

            async def online() -> bool:
                found = await asyncio.to_thread(agents_of_token, s, revoked_id)
                return bool(found) and found[0]["state"] == "online"

            await async_wait_until(online, timeout=90, what="the agent online with the token")

            answer = await asyncio.to_thread(s.api, "DELETE", f"/agent-tokens/{revoked_id}")
            assert answer.status_code == 204, answer.text

            async def exited() -> bool:
                return proc.poll() is not None

            await async_wait_until(
                exited, timeout=EXIT_BOUND_S, what=f"the agent to exit:\n{log_path.read_text()}"
            )
            assert proc.returncode == 3, log_path.read_text()
            output = log_path.read_text()
            assert "connection closed with 4010: exiting with 3" in output, output
            assert "reconnecting" not in output, output
            [row] = await asyncio.to_thread(agents_of_token, s, revoked_id)
            assert row["state"] == "offline"

        # Only that token's agents were closed: the other one is still served.
        await bystander.send(p.Heartbeat(ts=0.0, running=[], free_slots=1))
        assert isinstance(await bystander.next_of(p.HeartbeatAck, timeout=30), p.HeartbeatAck)
        assert bystander.close_code is None
        await bystander.close()


async def test_a_revocation_the_node_did_not_hear_of_closes_the_agent_at_its_next_token_check(
    database_url: str, tmp_path: Path
) -> None:
    # Dead-after 3 s: the hub's heartbeat (and its token re-check) every second.
    with stage(
        tmp_path, database_url, {"ci": SINGLE_WORKFLOW}, {"CONVEYOR_AGENT_DEAD_AFTER_MS": "3000"}
    ) as s:
        token_id, token = mint(s, ["linux"])
        agent = ScriptedAgent(s.ws_url, token, agent_id="unaware", heartbeat_s=0.3)
        await agent.connect()
        # Revoked in the database only: no route ran, so no notice reached the hub.
        engine = create_sync_engine(database_url)
        try:
            with engine.begin() as conn:
                conn.execute(
                    update(agent_tokens).where(agent_tokens.c.id == token_id).values(revoked_at=utc_now())
                )
        finally:
            engine.dispose()
        assert await agent.wait_closed(timeout=30) == p.CLOSE_AUTH_FAILED
        answer, code = await ScriptedAgent(s.ws_url, token, agent_id="unaware").connect_refused()
        assert isinstance(answer, p.AuthFailure) and code == p.CLOSE_AUTH_FAILED
        await agent.close()
