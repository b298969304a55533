"""`conveyor admin registration register-manual --database-url` (docs/design/events.md §7): with the orchestrator
down, the CLI writes the manual registration straight into the database, through the route's own function,
so the rows match what the admin API writes; on SQLite and PostgreSQL.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from sqlalchemy import select

from conveyor.db.engine import Database
from conveyor.db.tables import (
    access_log,
    cron_schedules,
    events,
    registration_triggers,
    workflow_registrations,
)
from tests.integration.events.conftest import DEPLOY_WORKFLOW
from tests.support.inprocess import in_process_server
from tests.support.processes import run_cli
from tests.support.repos import make_repo

NIGHTLY_WORKFLOW = """
from conveyor import schedule, workflow

nightly = workflow("nightly", on=[schedule("0 2 * * *")])

@nightly.job(runs_on=["linux"])
def build(ctx):
    ctx.sh(["echo", "nightly"])
"""

# What differs between two registrations of one lock for two repositories.
VARYING = {"id", "repo", "created_at", "updated_at", "registration_id", "armed_at"}


async def registered_rows(database_url: str, repo: str) -> dict[str, Any]:
    """The registration rows of `repo` (triggers and schedules by workflow), without what varies."""
    db = Database.connect(database_url, pool_size=1)
    try:
        async with db.read() as conn:
            rows = [
                dict(r._mapping)
                for r in await conn.execute(
                    select(workflow_registrations).where(workflow_registrations.c.repo == repo)
                )
            ]
            shown: dict[str, Any] = {}
            for row in rows:
                triggers = await conn.execute(
                    select(registration_triggers).where(registration_triggers.c.registration_id == row["id"])
                )
                schedules = await conn.execute(
                    select(cron_schedules).where(cron_schedules.c.registration_id == row["id"])
                )
                shown[row["workflow_name"]] = {
                    "row": {k: v for k, v in row.items() if k not in VARYING},
                    "triggers": sorted(
                        json.dumps({k: v for k, v in t._mapping.items() if k not in VARYING}, default=str)
                        for t in triggers
                    ),
                    "schedules": sorted(
                        (s.cron, s.timezone, s.schedule_key.replace(row["id"], "ID")) for s in schedules
                    ),
                }
            updated = [
                {k: v for k, v in e.payload.items() if k != "repo"}
                for e in await conn.execute(
                    select(events.c.payload).where(events.c.name == "conveyor.registration.updated")
                )
                if e.payload["repo"] == repo
            ]
            offline = [
                (a.action, a.status_code, a.target_id, a.permission)
                for a in await conn.execute(select(access_log).where(access_log.c.source == "cli_offline"))
            ]
    finally:
        await db.dispose()
    return {"registrations": shown, "updated_events": updated, "offline_log": offline}


async def test_the_direct_database_mode_writes_the_rows_the_api_writes(
    database_url: str, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path / "repo", {"deploy": DEPLOY_WORKFLOW, "nightly": NIGHTLY_WORKFLOW})
    lock_file = repo / ".conveyor" / "conveyor.lock.json"
    async with in_process_server(database_url, tmp_path / "home") as server:
        source = await server.client.post(
            "/api/v1/admin/sources",
            json={"kind": "local", "name": "app", "path": str(repo)},
            headers=server.auth(),
        )
        assert source.status_code == 201, source.text
        routing_key = source.json()["routing_key"]
        answer = await server.client.post(
            "/api/v1/admin/registrations/manual",
            json={"routing_key": routing_key, "repo": "acme/app", "lock": json.loads(lock_file.read_text())},
            headers=server.auth(),
        )
        assert answer.status_code == 200, answer.text
    # The orchestrator is down now.
    args = ["admin", "registration", "register-manual", "--database-url", database_url, "--json"]
    args += ["--lock-file", str(lock_file), "--routing-key", routing_key]
    done = await asyncio.to_thread(run_cli, [*args, "--repo", "acme/copy"])
    assert done.returncode == 0, done.stderr
    assert (
        json.loads(done.stdout)
        == answer.json()
        == {
            "created": ["deploy", "nightly"],
            "updated": [],
            "skipped_global": [],
        }
    )
    via_api = await registered_rows(database_url, "acme/app")
    direct = await registered_rows(database_url, "acme/copy")
    assert direct["registrations"] == via_api["registrations"]
    assert set(direct["registrations"]) == {"deploy", "nightly"}
    assert direct["registrations"]["nightly"]["schedules"] and direct["registrations"]["deploy"]["triggers"]
    assert direct["updated_events"] == via_api["updated_events"] and len(direct["updated_events"]) == 1
    assert direct["offline_log"] == [("registrations.manual", 200, "acme/copy", "registration.manage")]
    # Again: the same rows updated, not duplicated.
    again = await asyncio.to_thread(run_cli, [*args, "--repo", "acme/copy"])
    assert json.loads(again.stdout)["updated"] == ["deploy", "nightly"]
    assert (await registered_rows(database_url, "acme/copy"))["registrations"] == via_api["registrations"]


async def test_the_direct_mode_refuses_an_unknown_routing_key_and_a_bad_lock(
    database_url: str, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"x": 1}')
    good = make_repo(tmp_path / "repo", {"deploy": DEPLOY_WORKFLOW}) / ".conveyor" / "conveyor.lock.json"
    base = ["admin", "registration", "register-manual", "--database-url", database_url, "--repo", "r"]
    unknown = await asyncio.to_thread(
        run_cli, [*base, "--lock-file", str(good), "--routing-key", "local:nobody"]
    )
    assert unknown.returncode == 4 and "local:nobody" in unknown.stderr
    invalid = await asyncio.to_thread(
        run_cli, [*base, "--lock-file", str(bad), "--routing-key", "local:nobody"]
    )
    assert invalid.returncode == 2 and "not a valid lock file" in invalid.stderr
