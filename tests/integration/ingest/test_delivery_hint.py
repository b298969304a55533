"""The request that stores a delivery hands its processing what it already knows (issue 19's fast path):
the lock is read while the lease commits, the org is not read again, and dispatch is woken as soon as
the runs commit rather than after the delivery's own bookkeeping."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from conveyor.db.tables import deliveries
from conveyor.ingest import store
from conveyor.ingest.providers.git import GitProvider
from conveyor.ingest.service import INGEST
from tests.support.git_sources import git_source, processed, push, without_recovery_scans
from tests.support.inprocess import InProcessServer

# How long a lease waits for the lock read to begin before it gives up and records that it waited in
# vain (the read never overlapped it); far above the milliseconds the hint path takes.
OVERLAP_WAIT_S = 20.0


async def test_the_lock_is_read_while_the_lease_commits_and_fetched_once(
    server: InProcessServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source_id, sha = await git_source(server, tmp_path)
    read_started = asyncio.Event()
    waited_in_vain: list[str] = []
    original_fetch = GitProvider.fetch_lock
    original_lease = store.lease_delivery

    async def fetch_lock(self: GitProvider, *args: Any, **kwargs: Any) -> bytes | None:
        read_started.set()
        return await original_fetch(self, *args, **kwargs)

    async def lease_after_the_read_began(conn: Any, row_id: str, *args: Any) -> bool:
        # Sequential processing reads the lock only after this returns, so it would wait here in vain.
        try:
            await asyncio.wait_for(read_started.wait(), OVERLAP_WAIT_S)
        except TimeoutError:
            waited_in_vain.append(row_id)
        return await original_lease(conn, row_id, *args)

    monkeypatch.setattr(GitProvider, "fetch_lock", fetch_lock)
    monkeypatch.setattr(store, "lease_delivery", lease_after_the_read_began)
    without_recovery_scans(monkeypatch)

    row = await processed(server, await push(server, source_id, sha))

    assert waited_in_vain == [], "the lock read did not start before the lease was taken"
    assert row["status"] == "processed" and len(row["runs"]) == 1
    provider = server.state.parts.need(INGEST).pipeline._providers["git"]
    assert provider.fetches == 1, "processing fetched the commit again instead of joining the read"


async def test_a_webhook_delivery_is_not_read_back_for_its_org(
    server: InProcessServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source_id, sha = await git_source(server, tmp_path)
    org_reads: list[str] = []
    original = store.delivery_org

    async def delivery_org(conn: Any, row_id: str) -> str | None:
        org_reads.append(row_id)
        return await original(conn, row_id)

    monkeypatch.setattr(store, "delivery_org", delivery_org)
    without_recovery_scans(monkeypatch)
    assert server.state.parts.need(INGEST).pipeline.gate is not None, "the org gate is what reads the org"

    delivery = await push(server, source_id, sha)
    row = await processed(server, delivery)

    assert row["status"] == "processed"
    assert delivery not in org_reads


async def test_dispatch_is_woken_once_the_runs_commit_before_the_delivery_is_finished(
    server: InProcessServer, tmp_path: Path
) -> None:
    source_id, sha = await git_source(server, tmp_path)
    pipeline = server.state.parts.need(INGEST).pipeline
    original = pipeline._on_runs_created
    seen: list[tuple[list[str], str]] = []

    async def runs_created(run_ids: list[str]) -> None:
        async with server.state.db.read() as conn:
            rows = await conn.execute(select(deliveries.c.status))
            statuses = {str(status) for (status,) in rows.all()}
        seen.append((run_ids, ",".join(sorted(statuses))))
        await original(run_ids)

    pipeline._on_runs_created = runs_created

    row = await processed(server, await push(server, source_id, sha))

    assert row["status"] == "processed" and len(row["runs"]) == 1
    assert seen == [(row["runs"], "received")], "dispatch was woken only after the delivery was finished"
