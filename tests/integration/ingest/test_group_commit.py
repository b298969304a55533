"""Group commit of deliveries on both databases: one commit for concurrent deliveries, each caller
answered only once its row is stored, and a row the database rejects failing only its own caller."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import func, select

from conveyor.db.engine import Database
from conveyor.db.tables import deliveries
from conveyor.ingest.batching import DeliveryWriter
from conveyor.ingest.providers.base import SourceRow
from conveyor.ingest.store import NewDelivery

SOURCE = SourceRow(
    id="src-1",
    org_id="default",
    name="app",
    kind="git",
    routing_key="git:app",
    repo="team/app",
    api_url=None,
    clone_url=None,
    default_branch="main",
    verify="none",
    signature_header=None,
    event_header=None,
    report="none",
    enabled=True,
)


def delivery(delivery_id: str, **changes: Any) -> NewDelivery:
    values: dict[str, Any] = {
        "source": SOURCE,
        "delivery_id": delivery_id,
        "event": "push",
        "action": None,
        "headers": {"x-gitea-event": "push"},
        "body": b'{"ref": "refs/heads/main"}',
        **changes,
    }
    return NewDelivery(**values)


async def stored_ids(db: Database) -> dict[str, str]:
    async with db.read() as conn:
        rows = await conn.execute(select(deliveries.c.delivery_id, deliveries.c.id))
        return {d: i for d, i in rows.all()}


async def test_concurrent_deliveries_share_one_commit_and_each_gets_its_row(database: Database) -> None:
    writer = DeliveryWriter(database)

    results = await asyncio.gather(*(writer.store(delivery(f"d-{n}")) for n in range(8)))

    assert list(writer.batch_sizes) == [8], "the eight deliveries were expected to share one commit"
    stored = await stored_ids(database)
    assert [row_id for row_id, _ in results] == [stored[f"d-{n}"] for n in range(8)]
    assert all(created for _, created in results)


async def test_a_redelivery_in_the_same_batch_or_a_later_one_is_a_duplicate_of_the_stored_row(
    database: Database,
) -> None:
    writer = DeliveryWriter(database)

    first, again_in_batch = await asyncio.gather(
        writer.store(delivery("same")), writer.store(delivery("same"))
    )
    later = await writer.store(delivery("same"))

    assert first[1] is True and again_in_batch == (first[0], False) and later == (first[0], False)
    async with database.read() as conn:
        count = (await conn.execute(select(func.count()).select_from(deliveries))).scalar_one()
    assert count == 1


async def test_a_row_the_database_rejects_fails_alone_and_its_batch_neighbours_commit(
    database: Database,
) -> None:
    writer = DeliveryWriter(database)
    batch = [delivery("good-1"), delivery("bad", event=None), delivery("good-2"), delivery("good-3")]

    results = await asyncio.gather(*(writer.store(d) for d in batch), return_exceptions=True)

    # Tried as one batch of four, then each member alone.
    assert list(writer.batch_sizes) == [4, 1, 1, 1, 1]
    assert isinstance(results[1], Exception), "the NOT NULL violation must reach its own caller"
    stored = await stored_ids(database)
    assert set(stored) == {"good-1", "good-2", "good-3"}
    for index, name in ((0, "good-1"), (2, "good-2"), (3, "good-3")):
        assert results[index] == (stored[name], True)


async def test_a_delivery_arriving_at_an_idle_writer_commits_alone_at_once(database: Database) -> None:
    writer = DeliveryWriter(database)

    row_id, created = await writer.store(delivery("alone"))

    assert created and list(writer.batch_sizes) == [1]
    assert (await stored_ids(database)) == {"alone": row_id}


@pytest.mark.parametrize("max_rows", [3])
async def test_a_burst_larger_than_a_batch_is_committed_in_several(database: Database, max_rows: int) -> None:
    writer = DeliveryWriter(database, max_rows=max_rows)

    await asyncio.gather(*(writer.store(delivery(f"d-{n}")) for n in range(7)))

    assert list(writer.batch_sizes) == [3, 3, 1]
    assert len(await stored_ids(database)) == 7
