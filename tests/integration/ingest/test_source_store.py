"""Creating a source whose name is taken answers None, and the caller's transaction goes on (`ingest/store.py`).

`POST /sources` turns None into a 409 and still writes its access-log row in the same transaction, so the
failed insert must not take the transaction down with it.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from conveyor.db.engine import Database
from conveyor.db.tables import sources
from conveyor.ingest import store


def _values(name: str, routing_key: str) -> dict[str, Any]:
    return {"org_id": "default", "name": name, "kind": "git", "routing_key": routing_key, "repo": "acme/app"}


async def test_a_source_whose_name_is_taken_is_not_created_and_the_transaction_goes_on(
    database: Database,
) -> None:
    async with database.transaction() as conn:
        first = await store.insert_new_source(conn, _values("app", "git:app"))
        again = await store.insert_new_source(conn, _values("app", "git:app"))
        other = await store.insert_new_source(conn, _values("lib", "git:lib"))

    assert first is not None and other is not None
    assert again is None
    async with database.read() as conn:
        names = sorted((await conn.execute(select(sources.c.name))).scalars())
    assert names == ["app", "lib"]
