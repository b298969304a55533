"""A database that cannot serve a request (pool exhausted) answers 503 `unavailable`, not 500.

Admin routes already answer 503 `auth_unavailable` from the token check; the webhook route has no
admin token and reads its source first, so it shows the app-wide mapping.
"""

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from sqlalchemy.ext.asyncio import AsyncConnection

from tests.support.inprocess import InProcessServer, in_process_server
from tests.support.waiting import async_wait_until


@pytest.fixture
async def small_pool_server(postgres_url: str, tmp_path: Path) -> AsyncIterator[InProcessServer]:
    env = {"CONVEYOR_DB_POOL_SIZE": "1", "CONVEYOR_READY_DB_TIMEOUT_MS": "500"}
    async with in_process_server(postgres_url, tmp_path / "home", env=env) as running:
        yield running


async def test_an_exhausted_pool_answers_503_with_retry_after(small_pool_server: InProcessServer) -> None:
    server = small_pool_server
    # Pool size 1 plus 1 overflow: holding both leaves nothing for the request. The server's own
    # background loops compete for them too, so take them as they come free.
    held: list[AsyncConnection] = []

    async def both_held() -> bool:
        try:
            held.append(await server.state.db.engine.connect())
        except PoolTimeoutError:
            pass
        return len(held) == 2

    try:
        await async_wait_until(both_held, timeout=30, what="both pooled connections held by the test")
        answer = await server.client.post("/webhooks/src_nowhere", content=b"{}")
    finally:
        for conn in held:
            await conn.close()
    assert answer.status_code == 503, answer.text
    assert answer.json()["error"] == "unavailable"
    assert answer.headers["Retry-After"] == "5"

    async def served() -> httpx.Response | None:
        after = await server.client.post("/webhooks/src_nowhere", content=b"{}")
        return after if after.status_code != 503 else None

    after = await async_wait_until(served, timeout=30, what="the pool to serve requests again")
    assert after is not None
    assert after.status_code == 404 and after.json()["error"] == "unknown_source"
