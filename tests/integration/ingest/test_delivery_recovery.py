"""The recovery scan processes every due delivery whatever one of them does (issue 35, high 4).

A form-encoded delivery that needed a retry was read back as JSON, and the exception ended the scan's
round before any other delivery: one bad delivery stopped recovery for every source. A delivery is now
decoded as it was received, and whatever fails once it is leased is recorded on it (error, attempts),
retried with back-off and finally `failed`, while the others are processed.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from conveyor.db.engine import Database
from conveyor.ingest import store
from conveyor.ingest.pipeline import DeliveryHint, DeliveryPipeline, Outcome
from conveyor.ingest.providers.base import SourceProvider, SourceRow
from conveyor.ingest.providers.git import GitProvider
from conveyor.ingest.providers.parsing import parse_git
from conveyor.ingest.service import INGEST, DeliveryRecovery
from tests.integration.dashboard.conftest import signed_in
from tests.support.inprocess import InProcessServer
from tests.support.repos import git, make_repo
from tests.support.waiting import async_wait_until

INSTANCE = "instance-under-test"


async def git_source_row(db: Database, name: str, origin: Path) -> SourceRow:
    async with db.transaction() as conn:
        return await store.insert_source(
            conn,
            {
                "org_id": "default",
                "name": name,
                "kind": "git",
                "routing_key": f"git:{name}",
                "repo": f"team/{name}",
                "clone_url": f"file://{origin}",
                "default_branch": "main",
                "verify": "none",
                "report": "none",
            },
        )


def origin_repo(path: Path) -> tuple[Path, str]:
    origin = make_repo(path)
    git(origin, "config", "uploadpack.allowFilter", "true")
    git(origin, "config", "uploadpack.allowAnySHA1InWant", "true")
    return origin, git(origin, "rev-parse", "HEAD")


def push_body(sha: str) -> dict[str, Any]:
    return {"ref": "refs/heads/main", "before": "0" * 40, "after": sha, "commits": []}


async def store_delivery(
    db: Database, source: SourceRow, body: bytes, headers: Mapping[str, str], delivery_id: str
) -> str:
    async with db.transaction() as conn:
        row_id, created = await store.insert_delivery(
            conn,
            store.NewDelivery(
                source=source,
                delivery_id=delivery_id,
                event="push",
                action=None,
                headers=dict(headers),
                body=body,
            ),
        )
    assert created
    return row_id


def form_encoded(payload: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
    return urlencode({"payload": json.dumps(payload)}).encode(), {
        "content-type": "application/x-www-form-urlencoded",
        "x-gitea-event": "push",
    }


def as_json(payload: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
    return json.dumps(payload).encode(), {"content-type": "application/json", "x-gitea-event": "push"}


async def no_secret(_source_id: str, _name: str) -> str | None:
    return None


def pipeline_for(
    db: Database,
    tmp_path: Path,
    retry_delays_s: tuple[float, ...],
    providers: Mapping[str, SourceProvider] | None = None,
) -> DeliveryPipeline:
    return DeliveryPipeline(
        db,
        providers if providers is not None else {"git": GitProvider(tmp_path / "git-cache", no_secret)},
        owner=lambda: INSTANCE,
        retry_delays_s=retry_delays_s,
    )


async def delivery(db: Database, row_id: str) -> dict[str, Any]:
    async with db.read() as conn:
        row = await store.get_delivery(conn, row_id)
    assert row is not None
    return row


async def test_a_form_encoded_delivery_retried_by_recovery_is_decoded_as_received_and_the_others_follow(
    database: Database, tmp_path: Path
) -> None:
    origin, sha = origin_repo(tmp_path / "origin")
    other_origin, other_sha = origin_repo(tmp_path / "other")
    first = await git_source_row(database, "first", origin)
    second = await git_source_row(database, "second", other_origin)
    pipeline = pipeline_for(database, tmp_path, retry_delays_s=(0.0, 0.0, 0.0))
    recovery = DeliveryRecovery(database, pipeline, interval_s=60)

    # The first attempt, from the request that stored it, meets an origin that is away: a retry is due.
    away = tmp_path / "away"
    shutil.move(origin, away)
    body, headers = form_encoded(push_body(sha))
    form_row = await store_delivery(database, first, body, headers, "form-1")
    hint = DeliveryHint(first, parse_git(headers, body))
    outcome = await pipeline.process(form_row, hint)
    assert outcome is not None and outcome.status == "received"
    assert (await delivery(database, form_row))["attempts"] == 1
    shutil.move(away, origin)
    # Stored after it, so due after it: recovery meets the form-encoded delivery first.
    body, headers = as_json(push_body(other_sha))
    json_row = await store_delivery(database, second, body, headers, "json-1")

    assert await recovery.scan_once() == 2

    for row_id in (form_row, json_row):
        row = await delivery(database, row_id)
        assert row["status"] == "processed" and row["run_count"] == 1, row
    await pipeline.drain()


async def test_a_delivery_whose_processing_keeps_failing_records_each_attempt_then_fails_and_others_proceed(
    database: Database, tmp_path: Path
) -> None:
    origin, sha = origin_repo(tmp_path / "origin")
    source = await git_source_row(database, "app", origin)
    async with database.transaction() as conn:
        orphan = await store.insert_source(
            conn,
            {
                "org_id": "default",
                "name": "unserved",
                "kind": "github",  # no provider serves it in this pipeline: processing raises each time
                "routing_key": "github:unserved",
                "repo": "acme/unserved",
                "default_branch": "main",
                "verify": "hmac",
                "report": "none",
            },
        )
    pipeline = pipeline_for(database, tmp_path, retry_delays_s=(0.0, 0.0))
    recovery = DeliveryRecovery(database, pipeline, interval_s=60)
    body, headers = as_json(push_body(sha))
    failing = await store_delivery(database, orphan, body, headers, "bad-1")
    good = await store_delivery(database, source, body, headers, "good-1")

    await recovery.scan_once()

    row = await delivery(database, failing)
    assert row["status"] == "failed" and row["attempts"] == 2, row
    assert row["error"] == "KeyError: 'github'"
    assert (await delivery(database, good))["status"] == "processed"
    await pipeline.drain()


async def test_a_stored_body_that_cannot_be_decoded_fails_at_once_with_its_reason(
    database: Database, tmp_path: Path
) -> None:
    origin, sha = origin_repo(tmp_path / "origin")
    source = await git_source_row(database, "app", origin)
    pipeline = pipeline_for(database, tmp_path, retry_delays_s=(0.0, 0.0, 0.0))
    recovery = DeliveryRecovery(database, pipeline, interval_s=60)
    broken = await store_delivery(
        database, source, b"payload=%7Bnot", {"content-type": "text/plain"}, "broken"
    )
    body, headers = as_json(push_body(sha))
    good = await store_delivery(database, source, body, headers, "good")

    await recovery.scan_once()

    row = await delivery(database, broken)
    assert row["status"] == "failed" and row["error"].startswith(
        "the stored body cannot be decoded: body "
    ), row
    assert (await delivery(database, good))["status"] == "processed"
    await pipeline.drain()


async def test_a_form_encoded_webhook_that_keeps_failing_ends_failed_with_its_reason_shown(
    server: InProcessServer, tmp_path: Path
) -> None:
    created = await server.client.post(
        "/api/v1/admin/sources",
        json={
            "kind": "git",
            "name": "gone",
            "repo": "team/gone",
            "clone_url": f"file://{tmp_path}/nowhere",
            "verify": "none",
        },
        headers=server.auth(),
    )
    assert created.status_code == 201, created.text
    # Retried at once instead of after 10 s: the first attempt is the request's own, the second the
    # recovery scan's (every 200 ms here), which reads the delivery back from its row.
    server.state.parts.need(INGEST).pipeline._retry_delays_s = (0.0, 0.0)
    body, headers = form_encoded(push_body("c" * 40))
    answer = await server.client.post(f"/webhooks/{created.json()['id']}", content=body, headers=headers)
    assert answer.status_code == 202, answer.text
    delivery_id = answer.json()["delivery"]

    async def ended() -> dict[str, Any] | None:
        row = (
            await server.client.get(f"/api/v1/admin/deliveries/{delivery_id}", headers=server.auth())
        ).json()
        return row if row["status"] != "received" else None

    row = await async_wait_until(ended, timeout=30, what="the delivery to end")
    assert row["status"] == "failed" and row["attempts"] == 2, row
    assert row["error"].startswith("git fetch failed"), row
    async with signed_in(server, server.owner_token) as browser:
        page = await browser.get(f"/ui/deliveries/{delivery_id}")
    assert page.status_code == 200
    assert "git fetch failed" in page.text and "failed" in page.text


class MeetingPipeline(DeliveryPipeline):
    """A pipeline whose processing of a delivery waits until `parties` are being processed at once."""

    def __init__(self, *args: Any, parties: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.barrier = asyncio.Barrier(parties)

    async def process(self, row_id: str, hint: DeliveryHint | None = None) -> Outcome | None:
        async with asyncio.timeout(30):  # what a scan taking deliveries one at a time never passes
            await self.barrier.wait()
        return await super().process(row_id, hint)


async def test_recovery_processes_a_backlog_side_by_side_not_one_at_a_time(
    database: Database, tmp_path: Path
) -> None:
    # A coordinator killed under load leaves thousands of stored deliveries; taken one at a time, each
    # waiting on its fetch and commits, they drained at one or two a second (a 30-minute chaos run).
    origin, sha = origin_repo(tmp_path / "origin")
    source = await git_source_row(database, "app", origin)
    pipeline = MeetingPipeline(
        database,
        {"git": GitProvider(tmp_path / "git-cache", no_secret)},
        owner=lambda: INSTANCE,
        retry_delays_s=(0.0,),
        parties=3,
    )
    body, headers = as_json(push_body(sha))
    rows = [await store_delivery(database, source, body, headers, f"backlog-{i}") for i in range(3)]

    assert await DeliveryRecovery(database, pipeline, interval_s=60).scan_once() == 3

    for row_id in rows:
        assert (await delivery(database, row_id))["status"] == "processed"
    await pipeline.drain()
