"""Background delivery processing is bounded: a webhook burst cannot take the database pool."""

from __future__ import annotations

import asyncio
from typing import Any

from conveyor.ingest.pipeline import PROCESS_CONCURRENCY, DeliveryPipeline, Outcome


async def test_a_burst_of_kicked_deliveries_is_processed_a_few_at_a_time() -> None:
    pipeline = DeliveryPipeline(db=Any, providers={}, owner=lambda: "node-a")  # type: ignore[arg-type]
    running: set[str] = set()
    most = 0
    done: list[str] = []
    release = asyncio.Event()
    full = asyncio.Event()

    async def process(row_id: str, hint: object = None) -> Outcome:
        nonlocal most
        running.add(row_id)
        most = max(most, len(running))
        if len(running) == PROCESS_CONCURRENCY:
            full.set()
        await release.wait()
        running.discard(row_id)
        done.append(row_id)
        return Outcome("processed")

    pipeline.process = process  # type: ignore[method-assign]
    for index in range(3 * PROCESS_CONCURRENCY):
        pipeline.kick(f"delivery-{index}")
    await asyncio.wait_for(full.wait(), timeout=10)
    assert len(running) == PROCESS_CONCURRENCY
    release.set()
    await pipeline.drain()
    assert most == PROCESS_CONCURRENCY and len(done) == 3 * PROCESS_CONCURRENCY
