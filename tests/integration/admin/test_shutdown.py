"""Shutting the app down leaves nothing running and loses no token use."""

import asyncio
from pathlib import Path

from conveyor.admin.store import find_token_by_hash
from conveyor.admin.tokens import hash_token
from tests.support.inprocess import in_process_server


async def test_shutdown_leaves_no_task_behind_and_writes_the_token_use(
    database_url: str, tmp_path: Path
) -> None:
    async with in_process_server(database_url, tmp_path / "home") as server:
        answer = await server.client.get("/api/v1/admin/org-settings/default", headers=server.auth())
        assert answer.status_code == 200
        db, token = server.state.db, server.owner_token

    left = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    assert left == []
    # The use was only queued (the flush interval is 500 ms); the shutdown flush wrote it.
    async with db.read() as conn:
        row = await find_token_by_hash(conn, hash_token(token))
    assert row is not None and row.last_used_at is not None
    await db.dispose()
