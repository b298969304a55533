"""Concurrent deliveries share the commits of their leases and of their outcomes (issue 20), and a
delivery hinted by the request that stored it is not read back from the database."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from conveyor.db.write_batching import WriteBatcher
from conveyor.ingest import pipeline as pipeline_module
from conveyor.ingest.service import INGEST
from tests.support.git_sources import git_source, processed, push, without_recovery_scans
from tests.support.inprocess import InProcessServer

DELIVERIES = 12
QUIET_BRANCH = "refs/heads/no-workflow-listens"


def arrive_together(batcher: WriteBatcher, monkeypatch: pytest.MonkeyPatch) -> None:
    """Hand the batcher each unit only once every delivery has one for it: the deliveries then arrive
    at once, as they do under load, whatever this machine's timing."""
    arrived = 0
    everyone = asyncio.Event()
    run = batcher.run

    async def run_together(unit: Any) -> Any:
        nonlocal arrived
        arrived += 1
        if arrived == DELIVERIES:
            everyone.set()
        await asyncio.wait_for(everyone.wait(), 60)
        return await run(unit)

    monkeypatch.setattr(batcher, "run", run_together)


async def test_concurrent_deliveries_share_lease_and_outcome_commits(
    server: InProcessServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source_id, sha = await git_source(server, tmp_path)
    pipeline = server.state.parts.need(INGEST).pipeline
    original_parse = pipeline_module.parsed_from_row
    read_back: list[str] = []

    def parsed_from_row(row: Any) -> Any:
        read_back.append(row["id"])
        return original_parse(row)

    monkeypatch.setattr(pipeline_module, "parsed_from_row", parsed_from_row)
    arrive_together(pipeline.leases, monkeypatch)
    arrive_together(pipeline.outcomes, monkeypatch)
    without_recovery_scans(monkeypatch)

    stored = await asyncio.gather(
        *(push(server, source_id, sha, ref=QUIET_BRANCH, delivery=f"d-{n}") for n in range(DELIVERIES))
    )
    rows = [await processed(server, delivery) for delivery in stored]

    # A branch no workflow listens to: processed, no run.
    assert all(row["status"] == "processed" and row["runs"] == [] for row in rows)
    assert list(pipeline.leases.batch_sizes) == [DELIVERIES], "the leases did not share a transaction"
    assert list(pipeline.outcomes.batch_sizes) == [DELIVERIES], "the outcomes did not share a transaction"
    assert read_back == [], "a hinted delivery was read back from the database"
