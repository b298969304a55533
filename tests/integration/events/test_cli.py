"""`conveyor admin event|dlq|registration` against a real server process (both dialects)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from conveyor.db.engine import Database
from conveyor.db.tables import events
from conveyor.model.ids import new_id
from tests.integration.events.conftest import CI_WORKFLOW, DEPLOY_WORKFLOW
from tests.support.cli import invoke
from tests.support.http import HTTP
from tests.support.processes import ServerProcess, run_cli
from tests.support.repos import git, make_repo
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

FAST_ENV = {
    "CONVEYOR_SWEEP_INTERVAL_MS": "200",
    "CONVEYOR_CLUSTER_HEARTBEAT_INTERVAL_MS": "200",
    "CONVEYOR_EVENTS_POLL_SECONDS": "0.3",
    "CONVEYOR_EVENTS_SCAN_SECONDS": "0.3",
    # The TTL cleanup runs every second, not once an hour: rows a test inserts must be within the TTL.
    "CONVEYOR_EVENTS_CLEANUP_SECONDS": "1",
}


@pytest.fixture(scope="module")
def running(module_database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One server per dialect for this module: each test reads only the events it made (by name or id)."""
    home = tmp_path_factory.mktemp("events-cli") / "home"
    server = ServerProcess(home, database_url=module_database_url, env=FAST_ENV)
    try:
        server.wait_ready(timeout=90)
        yield {
            "env": {"CONVEYOR_URL": server.url, "CONVEYOR_TOKEN": server.owner_token()},
            "server": server,
            "database_url": module_database_url,
            "home": home,
        }
    finally:
        server.stop()


def api(env: dict[str, str], method: str, path: str, **kwargs: Any) -> httpx.Response:
    return HTTP.request(
        method,
        f"{env['CONVEYOR_URL']}/api/v1/admin{path}",
        headers={"Authorization": f"Bearer {env['CONVEYOR_TOKEN']}"},
        timeout=30,
        **kwargs,
    )


def admin(env: dict[str, str], *args: str) -> Any:
    return invoke(["admin", *args], env=env)


def test_emit_list_show_through_the_cli(running: dict[str, Any], tmp_path: Path) -> None:
    env = running["env"]
    repo = make_repo(tmp_path / "repo", {"ci": CI_WORKFLOW, "deploy": DEPLOY_WORKFLOW})
    source = api(env, "POST", "/sources", json={"kind": "local", "name": "app", "path": str(repo)}).json()
    sha = git(repo, "rev-parse", "HEAD")
    pushed = api(env, "POST", f"/sources/{source['id']}/trigger", json={"ref": "refs/heads/main", "sha": sha})
    assert pushed.status_code == 202, pushed.text
    wait_until(
        lambda: api(env, "GET", "/registrations").json()["items"], timeout=60, what="the deploy registration"
    )

    emitted = run_cli(["admin", "event", "emit", "deploy.requested", "--payload", '{"env":"prod"}'], env=env)
    assert emitted.returncode == 0, emitted.stderr
    event_id = emitted.stdout.strip()

    def matched() -> dict[str, Any] | None:
        listed = run_cli(["admin", "event", "list", "--json"], env=env)
        assert listed.returncode == 0, listed.stderr
        item = next(i for i in json.loads(listed.stdout)["items"] if i["id"] == event_id)
        return item if item["state"] == "processed" else None

    item = wait_until(matched, timeout=60, what="the emitted event processed")
    assert item["match_outcome"] == "matched" and item["matched_count"] == 1
    shown = run_cli(["admin", "event", "show", event_id], env=env)
    assert shown.returncode == 0, shown.stderr
    run_id = api(env, "GET", f"/events/{event_id}").json()["runs"][0]["run_id"]
    assert run_id in shown.stdout and "deploy" in shown.stdout
    assert '"env": "prod"' in shown.stdout  # the owner may read the (redacted) payload

    bad = run_cli(["admin", "event", "emit", "__workflow_complete"], env=env)
    assert bad.returncode == 2 and "reserved_event_name" in bad.stderr and "Traceback" not in bad.stderr
    bad_json = run_cli(["admin", "event", "emit", "x", "--payload", "[1]"], env=env)
    assert bad_json.returncode == 2 and "JSON object" in bad_json.stderr
    missing = run_cli(["admin", "event", "show", new_id()], env=env)
    assert missing.returncode == 4 and "not_found" in missing.stderr

    regs = admin(env, "registration", "list", "--json")
    assert regs.exit_code == 0, regs.output
    assert [r["workflow_name"] for r in json.loads(regs.stdout)["items"]] == ["deploy"]


async def _insert_same_millisecond(url: str, count: int) -> set[str]:
    db = Database.connect(url, pool_size=2)
    # One millisecond, and a recent one: processed rows older than the TTL (7 days) are the
    # cleanup's to delete, and the leader runs it on every (re)acquired lease.
    now = datetime.now(UTC)
    at = now.replace(microsecond=now.microsecond // 1000 * 1000)
    ids = {new_id() for _ in range(count)}
    try:
        async with db.transaction() as conn:
            await conn.execute(
                events.insert(),
                [
                    {
                        "id": i,
                        "name": "bulk",
                        "origin": "admin",
                        "org_id": "default",
                        "payload": {},
                        "created_at": at,
                        "processed_at": at,
                        "match_outcome": "no-registration",
                        "matched_count": 0,
                        "attempts": 1,
                    }
                    for i in ids
                ],
            )
    finally:
        await db.dispose()
    return ids


def test_paging_a_thousand_same_millisecond_events_with_limit_7(running: dict[str, Any]) -> None:
    env = running["env"]
    url = running["database_url"]
    ids = asyncio.run(_insert_same_millisecond(url, 1000))
    seen: list[str] = []
    cursor: str | None = None
    while True:
        args = ["event", "list", "--name", "bulk", "--limit", "7", "--json"]
        result = admin(env, *args, *(["--cursor", cursor] if cursor else []))
        assert result.exit_code == 0, result.output
        page = json.loads(result.stdout)
        assert len(page["items"]) <= 7
        seen.extend(item["id"] for item in page["items"])
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert len(seen) == 1000 and set(seen) == ids

    tampered = admin(env, "event", "list", "--name", "other", "--limit", "7", "--cursor", "abc", "--json")
    assert tampered.exit_code == 2 and "invalid_cursor" in tampered.output
    too_many = api(env, "GET", "/events", params={"limit": 501})
    assert too_many.status_code == 400 and too_many.json()["error"] == "invalid_request"
    bad_state = api(env, "GET", "/events", params={"state": "done"})
    assert bad_state.status_code == 400


async def _insert_dead_scale_up(url: str) -> str:
    db = Database.connect(url, pool_size=2)
    event_id = new_id()
    now = datetime.now(UTC)
    try:
        async with db.transaction() as conn:
            await conn.execute(
                events.insert().values(
                    id=event_id,
                    name="conveyor.scaler.scale_up",
                    origin="system",
                    payload={"request_id": "r", "claim_code": "claim-123", "extra": {"api_token": "tok-456"}},
                    target_repos=["ops/provision"],
                    created_at=now,
                    attempts=5,
                    dlq_at=now,
                    dlq_reason="exhausted_retries",
                    last_error="provisioner down",
                )
            )
    finally:
        await db.dispose()
    return event_id


def test_event_and_dlq_show_redact_a_scale_up_claim_code(running: dict[str, Any]) -> None:
    env = running["env"]
    event_id = asyncio.run(_insert_dead_scale_up(running["database_url"]))
    for args in (["event", "show", event_id], ["dlq", "show", event_id]):
        shown = run_cli(["admin", *args], env=env)
        assert shown.returncode == 0, shown.stderr
        assert '"claim_code": "[redacted]"' in shown.stdout and '"api_token": "[redacted]"' in shown.stdout
        assert "claim-123" not in shown.stdout and "tok-456" not in shown.stdout
    listed = admin(env, "dlq", "list", "--json")
    assert [i["id"] for i in json.loads(listed.stdout)["items"]] == [event_id]
    retried = admin(env, "dlq", "retry", event_id)
    assert retried.exit_code == 0 and "pending" in retried.stdout
    again = admin(env, "dlq", "retry", event_id)
    assert again.exit_code == 1 and "not_in_dlq" in again.output
