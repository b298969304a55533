"""`event_log_max_payload_bytes` (docs/design/execution.md §1.1), on both databases: an ended delivery's
stored body is cut with a marker, processing always decides on the whole body, a `failed` delivery keeps
its whole body for `replay`, and a cut body put back to be processed ends `failed` at once."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from sqlalchemy import select, update

from conveyor.db.tables import deliveries
from conveyor.ingest.service import INGEST
from conveyor.model.ids import utc_now
from tests.fakes.github import FakeGitHub, push_payload
from tests.support.github_ingest import add_github_source, post, processed
from tests.support.inprocess import InProcessServer
from tests.support.repos import git

LIMIT = 1024


async def patch_cluster(server: InProcessServer, values: dict[str, Any]) -> None:
    answer = await server.client.patch("/api/v1/admin/cluster-settings", json=values, headers=server.auth())
    assert answer.status_code == 200, answer.text


async def stored_payload(server: InProcessServer, delivery: str) -> dict[str, Any]:
    answer = await server.client.get(f"/api/v1/admin/deliveries/{delivery}/payload", headers=server.auth())
    assert answer.status_code == 200, answer.text
    return answer.json()  # type: ignore[no-any-return]


def big_push(repo: Path) -> dict[str, Any]:
    sha = git(repo, "rev-parse", "HEAD")
    payload = push_payload("acme/app", repo, ref="refs/heads/main", before="0" * 40, after=sha)
    # Past the limit, with the fields matching reads at the front and at the end of the body.
    payload["padding"] = "x" * (4 * LIMIT)
    payload["pusher"] = {"name": "late field"}
    return payload


async def test_an_ended_deliverys_body_is_cut_to_event_log_max_payload_bytes_after_processing_the_whole(
    server: InProcessServer, github: FakeGitHub, repo: Path
) -> None:
    await patch_cluster(server, {"event_log_max_payload_bytes": LIMIT})
    source = await add_github_source(server, github)
    payload = big_push(repo)
    body = json.dumps(payload).encode()

    answer = await post(server, source["id"], payload, delivery="big")
    row = await processed(server, answer.json()["delivery"])
    # Processed on the whole body: the runs exist.
    assert row["status"] == "processed" and len(row["runs"]) >= 1, row
    assert row["body_sha256"] == hashlib.sha256(body).hexdigest()  # it names the body received
    shown = await stored_payload(server, row["id"])
    assert shown["truncated"] == {"kept": LIMIT, "received": len(body)}
    assert shown["payload"] == body[:LIMIT].decode() + (
        f"\n[conveyor: payload truncated, kept {LIMIT} of {len(body)} bytes (event_log_max_payload_bytes)]\n"
    )

    # A body within the knob is kept whole.
    small = push_payload(
        "acme/app", repo, ref="refs/heads/main", before="0" * 40, after=git(repo, "rev-parse", "HEAD")
    )
    small_row = await processed(
        server, (await post(server, source["id"], small, delivery="small")).json()["delivery"]
    )
    small_shown = await stored_payload(server, small_row["id"])
    assert small_shown["payload"] == small and "truncated" not in small_shown

    # Put back to `received` (by hand: no API does it), the cut body ends `failed` at once, and no run
    # is created from what is left of it.
    async with server.state.db.transaction() as conn:
        await conn.execute(
            update(deliveries)
            .where(deliveries.c.id == row["id"])
            .values(status="received", lease_owner=None, lease_until=None, processed_at=None)
        )
    again = await processed(server, row["id"])
    assert again["status"] == "failed"
    assert again["error"] == (
        f"payload_truncated: the stored body keeps {LIMIT} of {len(body)} bytes "
        "(event_log_max_payload_bytes) and cannot be processed again; redeliver it"
    )
    assert sorted(again["runs"]) == sorted(row["runs"])


async def test_a_delivery_stored_but_not_yet_processed_keeps_its_whole_body_for_the_recovery_scan(
    server: InProcessServer, github: FakeGitHub, repo: Path
) -> None:
    await patch_cluster(server, {"event_log_max_payload_bytes": LIMIT})
    source = await add_github_source(server, github)
    service = server.state.parts.need(INGEST)
    payload = big_push(repo)
    # As after a crash between the 202 and processing: only the recovery scan takes the delivery.
    service.processing = False
    try:
        answer = await post(server, source["id"], payload, delivery="stored")
        delivery = answer.json()["delivery"]
        async with server.state.db.read() as conn:
            stored = (
                await conn.execute(select(deliveries.c.status).where(deliveries.c.id == delivery))
            ).scalar_one()
        assert stored == "received"
        assert "truncated" not in await stored_payload(server, delivery)
    finally:
        service.processing = True
    row = await processed(server, delivery)
    assert row["status"] == "processed" and row["runs"], row
    assert (await stored_payload(server, delivery))["truncated"]["kept"] == LIMIT


async def test_a_failed_delivery_keeps_its_whole_body_and_replays(
    server: InProcessServer, github: FakeGitHub, repo: Path
) -> None:
    await patch_cluster(server, {"event_log_max_payload_bytes": LIMIT})
    source = await add_github_source(server, github)
    payload = big_push(repo)
    github.fail_next.extend([500] * 20)  # the lock cannot be read: attempts run out
    answer = await post(server, source["id"], payload, delivery="failing")
    delivery = answer.json()["delivery"]
    async with server.state.db.transaction() as conn:  # no waiting out the back-off: the last attempt now
        await conn.execute(
            update(deliveries)
            .where(deliveries.c.id == delivery)
            .values(attempts=4, next_attempt_at=utc_now())
        )
    row = await processed(server, delivery)
    assert row["status"] == "failed", row
    assert "truncated" not in await stored_payload(server, delivery)

    github.fail_next.clear()
    replay = await server.client.post(f"/api/v1/admin/deliveries/{delivery}/replay", headers=server.auth())
    assert replay.status_code == 202, replay.text
    replayed = await processed(server, delivery)
    assert replayed["status"] == "processed" and replayed["runs"], replayed
    assert (await stored_payload(server, delivery))["truncated"]["kept"] == LIMIT
