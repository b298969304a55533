"""`POST /api/v1/agents/claim` and the claim store (docs/design/scaler.md §6.4), on each database.

A claim is redeemed once for a token bound to the spawn's agent id and labels; unknown, used,
expired and withdrawn codes get one and the same 401; attempts are throttled per address; consumed
and expired claims are deleted after the retention.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from conveyor.agents import store as agent_store
from conveyor.agents.tokens import AgentTokenRow
from conveyor.db.tables import scaler_claims
from conveyor.model.ids import new_id, utc_now
from conveyor.scaler import claims, store
from conveyor.scaler.routes import SCALER
from tests.support.inprocess import InProcessServer, in_process_server
from tests.support.waiting import async_wait_until

URL = "/api/v1/agents/claim"
WS = "ws://127.0.0.1:9/ws"


@pytest.fixture
async def server(database_url: str, tmp_path: Path) -> AsyncIterator[InProcessServer]:
    async with in_process_server(database_url, tmp_path / "home") as running:

        async def started() -> bool:
            return SCALER in running.state.parts

        await async_wait_until(started, what="the scaler service")
        yield running


async def _spawn(server: InProcessServer, *, ttl_s: float = 300, state: str = "spawning") -> tuple[str, str]:
    """A spawn of an `event` scaler with its ephemeral token and claim; returns (agent_id, code)."""
    agent_id, code, now = new_id(), claims.generate_claim_code(), utc_now()
    async with server.state.db.transaction() as conn:
        _, row = await agent_store.mint_agent_token(
            conn,
            labels=["cloud", "big"],
            mandatory_labels=[],
            label="scaler cloud",
            created_by="scaler:cloud",
            kind="ephemeral",
            single_use=True,
            expires_at=now + timedelta(hours=1),
            agent_id=agent_id,
        )
        await store.insert_spawn(
            conn,
            agent_id=agent_id,
            node_id="node",
            boot_id=new_id(),
            scaler="cloud",
            backend_type="event",
            label_set=["big", "cloud"],
            warm=False,
            state=state,
            token_id=row.id,
            spawned_at=now,
            deadline_at=now + timedelta(minutes=5),
        )
        await claims.insert_claim(
            conn, agent_id=agent_id, code=code, scaler="cloud", url=WS, now=now, ttl_s=ttl_s
        )
    return agent_id, code


async def _claim(server: InProcessServer, body: Any) -> Any:
    return await server.client.post(URL, json=body)


async def test_a_code_is_redeemed_once_for_a_token_bound_to_the_spawn(server: InProcessServer) -> None:
    agent_id, code = await _spawn(server)
    answer = await _claim(server, {"claim_code": code})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["agent_id"] == agent_id and body["url"] == WS and body["labels"] == ["big", "cloud"]
    assert body["agent_token_ttl_ms"] == 3_600_000 and body["token"].startswith("cvy_agent_")
    async with server.state.db.transaction() as conn:
        row = await agent_store.authenticate_agent_token(conn, body["token"], utc_now())
    assert isinstance(row, AgentTokenRow)
    assert row.agent_id == agent_id and row.kind == "ephemeral" and row.single_use
    assert row.labels == ["big", "cloud"]

    replay = await _claim(server, {"claim_code": code})
    unknown = await _claim(server, {"claim_code": claims.generate_claim_code()})
    assert replay.status_code == unknown.status_code == 401
    assert replay.json() == unknown.json() == {"error": "invalid_claim", "detail": claims_refused()}


def claims_refused() -> str:
    from conveyor.scaler.claim_route import REFUSED

    return REFUSED


async def test_expired_and_withdrawn_codes_are_refused_like_unknown_ones(server: InProcessServer) -> None:
    _, expired = await _spawn(server, ttl_s=-1)
    withdrawn_agent, withdrawn = await _spawn(server)
    async with server.state.db.transaction() as conn:
        await claims.expire_claim(conn, withdrawn_agent, utc_now())
    _, ended = await _spawn(server, state="destroying")
    answers = [await _claim(server, {"claim_code": code}) for code in (expired, withdrawn, ended, "x")]
    assert {a.status_code for a in answers} == {401}
    assert len({a.text for a in answers}) == 1


async def test_bad_bodies_are_400_and_change_nothing(server: InProcessServer) -> None:
    _, code = await _spawn(server)
    for raw in (b"not json", b"[]", b'{"claim_code": 7}', b"{}"):
        answer = await server.client.post(URL, content=raw, headers={"Content-Type": "application/json"})
        assert answer.status_code == 400 and answer.json()["error"] == "invalid_body", answer.text
    big = await server.client.post(URL, content=b"{" + b" " * 5000 + b"}")
    assert big.status_code == 413 and big.json()["error"] == "payload_too_large"
    assert (await _claim(server, {"claim_code": code})).status_code == 200


async def test_attempts_are_throttled_per_address(server: InProcessServer) -> None:
    _, code = await _spawn(server)
    for _ in range(claims.THROTTLE_ATTEMPTS):
        assert (await _claim(server, {"claim_code": "guess"})).status_code == 401
    limited = await _claim(server, {"claim_code": code})
    assert limited.status_code == 429 and limited.json()["error"] == "rate_limited"
    assert 1 <= int(limited.headers["Retry-After"]) <= 60
    # The good code was not spent by the refused attempt.
    async with server.state.db.read() as conn:
        consumed = (
            await conn.execute(select(func.count()).where(scaler_claims.c.consumed_at.is_not(None)))
        ).scalar()
    assert consumed == 0


async def test_consumed_and_expired_claims_are_deleted_after_the_retention(server: InProcessServer) -> None:
    _, used = await _spawn(server)
    await _spawn(server, ttl_s=-1)
    await _spawn(server)  # live
    assert (await _claim(server, {"claim_code": used})).status_code == 200
    retention_ms = 60_000
    async with server.state.db.transaction() as conn:
        assert await claims.delete_old_claims(conn, claims.purge_before(utc_now(), retention_ms)) == 0
        later = utc_now() + timedelta(milliseconds=retention_ms + 1000)
        assert await claims.delete_old_claims(conn, claims.purge_before(later, retention_ms)) == 2
        left = (await conn.execute(select(scaler_claims.c.consumed_at, scaler_claims.c.expires_at))).all()
    assert len(left) == 1 and left[0].consumed_at is None and left[0].expires_at > utc_now()


async def test_scaler_claim_retention_ms_is_a_live_cluster_knob_the_reaper_reads(
    server: InProcessServer,
) -> None:
    _, used = await _spawn(server)
    await _spawn(server, ttl_s=-1)  # expired
    await _spawn(server)  # live
    assert (await _claim(server, {"claim_code": used})).status_code == 200
    manager = server.state.parts.need(SCALER)

    async def claims_left() -> int:
        async with server.state.db.read() as conn:
            return int((await conn.execute(select(func.count()).select_from(scaler_claims))).scalar_one())

    # The default (24 h) keeps the used and the expired claim.
    await manager.reap_records()
    assert await claims_left() == 3
    answer = await server.client.patch(
        "/api/v1/admin/cluster-settings", json={"scaler_claim_retention_ms": 0}, headers=server.auth()
    )
    assert answer.status_code == 200, answer.text
    # Read live by the next reap: both go, the live claim stays.
    await manager.reap_records()
    assert await claims_left() == 1


async def test_an_endless_body_is_refused_before_it_is_read_whole(server: InProcessServer) -> None:
    """300 MiB sent without a length: the server answers 413 having read barely more than its 4 KiB limit."""
    sent = 0

    async def endless() -> AsyncIterator[bytes]:
        nonlocal sent
        chunk = b" " * 65536
        for _ in range(300 * 16):
            sent += len(chunk)
            yield chunk

    answer = await server.client.post(URL, content=endless(), headers={"Content-Type": "application/json"})
    assert answer.status_code == 413 and answer.json()["error"] == "payload_too_large", answer.text
    assert sent <= 2 * 65536, f"the server read {sent} bytes before refusing"
