"""Revoking an agent token on one coordinator closes its agents on the others (docs/design/cluster.md §2.4
`agent_token.revoke`, docs/design/execution.md §6 close 4010).

A real `conveyor agent` is connected to c2; the token is revoked through c1. c2 hears it over the peer
channel and closes the agent with 4010 well before its own token re-check (every agent heartbeat
interval, 15 s here) would, and the agent exits 3.
"""

import time
from typing import Any

import pytest

from tests.support.cluster import Cluster, Node, peers_by_id
from tests.support.http import HTTP
from tests.support.processes import agent_process
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("cluster-processes"), pytest.mark.timeout(300)]

# The notice crosses one peer socket; the hub's own re-check would take 15 s.
KICK_BOUND_S = 5.0


def agents_of_token(node: Node, token: str, token_id: str) -> list[dict[str, Any]]:
    answer = node.get("/api/v1/admin/agents?limit=200", token)
    assert answer.status_code == 200, answer.text
    return [a for a in answer.json()["items"] if a.get("token_id") == token_id]


def test_revoking_through_one_coordinator_closes_the_agent_connected_to_the_other(
    pg_cluster: Cluster, tmp_path: Any
) -> None:
    c1 = pg_cluster.coordinator("c1")
    c2 = pg_cluster.coordinator("c2")
    token = pg_cluster.token
    wait_until(lambda: peers_by_id(c1, token).get("c2", {}).get("connected"), what="c1 sees c2")
    wait_until(lambda: peers_by_id(c2, token).get("c1", {}).get("connected"), what="c2 sees c1")
    minted = c1.post("/api/v1/admin/agent-tokens", token, {"labels": ["linux"]})
    assert minted.status_code == 201, minted.text
    token_id, agent_token = minted.json()["id"], minted.json()["token"]

    ws_url = c2.url.replace("http://", "ws://") + "/ws"
    with agent_process(ws_url, agent_token, tmp_path / "agent") as (proc, log_path):
        wait_until(
            lambda: [a["state"] for a in agents_of_token(c2, token, token_id)] == ["online"],
            timeout=90,
            what="the agent online on c2",
        )
        [row] = agents_of_token(c2, token, token_id)
        assert row["instance_id"] == "c2"

        began = time.monotonic()
        revoked = HTTP.delete(
            f"{c1.url}/api/v1/admin/agent-tokens/{token_id}",
            headers={"Authorization": f"Bearer {token}"},
            timeout=10,
        )
        assert revoked.status_code == 204, revoked.text
        wait_until(
            lambda: [a["state"] for a in agents_of_token(c1, token, token_id)] == ["offline"],
            timeout=KICK_BOUND_S,
            what="c2 closes the agent",
        )
        assert time.monotonic() - began <= KICK_BOUND_S
        # Closed by the notice, not by c2's periodic re-check of its agents' tokens.
        assert f"its token {token_id} was revoked" in c2.output()
        wait_until(
            lambda: proc.poll() is not None, timeout=30, what=f"the agent exits:\n{log_path.read_text()}"
        )
        output = log_path.read_text()
        assert proc.returncode == 3, output
        assert "connection closed with 4010: exiting with 3" in output, output
