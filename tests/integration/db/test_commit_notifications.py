"""`Database.on_commit_notify`: a transaction's `notify` reaches this process's handlers after its commit."""

from __future__ import annotations

import pytest
from sqlalchemy import insert, select
from sqlalchemy.exc import IntegrityError

from conveyor.db.dialect import notify
from conveyor.db.engine import PENDING_NOTIFICATIONS, Database
from conveyor.db.tables import cluster_meta
from conveyor.model.ids import utc_now


class Boom(Exception):
    pass


async def test_handlers_run_after_commit_only_and_never_for_a_rollback(database_url: str) -> None:
    db = Database.connect(database_url)
    seen: list[str] = []
    db.on_commit_notify("chan", lambda payload: seen.append(payload))
    try:
        async with db.transaction() as conn:
            await notify(conn, "chan", "first")
            await notify(conn, "other", "ignored")
            await conn.execute(insert(cluster_meta).values(key="k1", value="v", created_at=utc_now()))
            assert seen == [], "nothing is delivered before the commit"
        assert seen == ["first"]

        with pytest.raises(Boom):
            async with db.transaction() as conn:
                await notify(conn, "chan", "rolled back")
                raise Boom
        assert seen == ["first"]

        # A statement that failed leaves the transaction unusable; the original error still surfaces.
        with pytest.raises(IntegrityError):
            async with db.transaction() as conn:
                await notify(conn, "chan", "failed")
                await conn.execute(insert(cluster_meta).values(key="k1", value="dup", created_at=utc_now()))
        assert seen == ["first"]

        # The pooled connection carries nothing into the next transaction or a read.
        async with db.transaction() as conn:
            assert PENDING_NOTIFICATIONS[conn] == []
        assert len(PENDING_NOTIFICATIONS) == 0
        async with db.read() as conn:
            assert conn not in PENDING_NOTIFICATIONS
            await notify(conn, "chan", "outside a transaction")
            assert "v" in (await conn.execute(select(cluster_meta.c.value))).scalars().all()
        assert seen == ["first"]
    finally:
        await db.dispose()
