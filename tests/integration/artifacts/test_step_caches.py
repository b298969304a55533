"""What each step's caches did, on the run (docs/design/caches.md §7), on SQLite and PostgreSQL: a lookup
and a commit that name their step are recorded against it, and the run's API body and its dashboard page
say `miss, saved` for the first run and `exact hit` for the second."""

from __future__ import annotations

import re
from typing import Any

from sqlalchemy import insert

from conveyor.db.tables import steps
from tests.integration.artifacts.conftest import Job, upload
from tests.integration.dashboard.conftest import signed_in
from tests.support.caches import job_for, push_event
from tests.support.inprocess import InProcessServer


async def with_steps(server: InProcessServer, job: Job, *names: str) -> Job:
    async with server.state.db.transaction() as conn:
        for index, name in enumerate(names):
            await conn.execute(
                insert(steps).values(
                    job_id=job.job_id, step_index=index, name=name, kind="step", status="success"
                )
            )
    return job


async def lookup(
    server: InProcessServer, job: Job, key: str, step: int | None, *restore: str
) -> dict[str, Any]:
    answer = await server.client.post(
        f"/api/v1/jobs/{job.job_id}/caches/lookup",
        json={"key": key, "restore_keys": list(restore)},
        params={} if step is None else {"step_index": step},
        headers=job.auth(),
    )
    assert answer.status_code == 200, answer.text
    found: dict[str, Any] = answer.json()
    return found


async def save(server: InProcessServer, job: Job, key: str, data: bytes, step: int | None) -> int:
    stored = await upload(server.client, job, data)
    assert stored.status_code == 201, stored.text
    body = {"key": key, **{k: stored.json()[k] for k in ("upload_id", "sha256", "size")}}
    made = await server.client.post(
        f"/api/v1/jobs/{job.job_id}/caches",
        json=body,
        params={} if step is None else {"step_index": step},
        headers=job.auth(),
    )
    return made.status_code


async def step_caches(server: InProcessServer, run_id: str) -> dict[str, list[dict[str, Any]]]:
    answer = await server.client.get(f"/api/v1/admin/runs/{run_id}", headers=server.auth())
    assert answer.status_code == 200, answer.text
    return {step["name"]: step["caches"] for step in answer.json()["jobs"][0]["steps"]}


async def page_caches(server: InProcessServer, run_id: str) -> list[str]:
    async with signed_in(server, server.owner_token) as browser:
        page = await browser.get(f"/ui/runs/{run_id}")
    assert page.status_code == 200, page.text
    return [
        re.sub(r"\s+", " ", text).strip()
        for text in re.findall(
            r"<small class=\"cache[^\"]*\" data-cache-of=\"[^\"]+\">(.*?)</small>", page.text
        )
    ]


async def test_a_first_run_shows_miss_and_saved_and_a_second_an_exact_hit(server: InProcessServer) -> None:
    first = await with_steps(server, await job_for(server, push_event("main")), "install", "lint")
    assert (await lookup(server, first, "deps-1", 0))["kind"] == "miss"
    assert await save(server, first, "deps-1", b"d" * 2048, 0) == 201
    # Step 1 looked a key up and committed nothing (it failed, or its save did).
    assert (await lookup(server, first, "tools-1", 1))["kind"] == "miss"

    second = await with_steps(server, await job_for(server, push_event("main")), "install", "lint")
    assert (await lookup(server, second, "deps-1", 0))["kind"] == "exact"
    # Another save of the taken key, as a concurrent job's would be: dropped, and said so.
    assert (await lookup(server, second, "deps-2", 1, "deps-"))["kind"] == "partial"
    assert await save(server, second, "deps-2", b"e" * 10, 1) == 201
    third = await job_for(server, push_event("main"))
    assert await save(server, third, "deps-2", b"f" * 10, 0) == 200

    assert await step_caches(server, first.run_id) == {
        "install": [
            {"key": "deps-1", "kind": "miss", "restored_key": None, "saved": "saved", "saved_size": 2048}
        ],
        "lint": [{"key": "tools-1", "kind": "miss", "restored_key": None, "saved": None, "saved_size": None}],
    }
    assert await step_caches(server, second.run_id) == {
        "install": [
            {"key": "deps-1", "kind": "exact", "restored_key": "deps-1", "saved": None, "saved_size": None}
        ],
        "lint": [
            {"key": "deps-2", "kind": "partial", "restored_key": "deps-1", "saved": "saved", "saved_size": 10}
        ],
    }
    assert await page_caches(server, first.run_id) == [
        "cache deps-1: miss, saved 2.0 KiB",
        "cache tools-1: miss, not saved",
    ]
    assert await page_caches(server, second.run_id) == [
        "cache deps-1: exact hit",
        "cache deps-2: partial hit (deps-1), saved 10 B",
    ]
    async with server.state.db.transaction() as conn:
        await conn.execute(
            insert(steps).values(
                job_id=third.job_id, step_index=0, name="install", kind="step", status="success"
            )
        )
    # A save with no lookup before it (the lookup never reached the server) is still shown.
    assert await step_caches(server, third.run_id) == {
        "install": [
            {"key": "deps-2", "kind": None, "restored_key": None, "saved": "dropped", "saved_size": None}
        ]
    }
    assert await page_caches(server, third.run_id) == [
        "cache deps-2: not looked up, not saved (the key exists)"
    ]


async def test_calls_naming_no_step_record_nothing_and_a_bad_step_is_refused(server: InProcessServer) -> None:
    job = await with_steps(server, await job_for(server, push_event("main")), "install")
    assert (await lookup(server, job, "deps-1", None))["kind"] == "miss"
    assert await save(server, job, "deps-1", b"d", None) == 201
    assert await step_caches(server, job.run_id) == {"install": []}
    assert await page_caches(server, job.run_id) == []
    refused = await server.client.post(
        f"/api/v1/jobs/{job.job_id}/caches/lookup",
        json={"key": "deps-1"},
        params={"step_index": -1},
        headers=job.auth(),
    )
    assert refused.status_code == 400 and refused.json()["error"] == "invalid_request", refused.text


def test_migration_0017_adds_step_caches_and_takes_it_out_again(empty_database_url: str) -> None:
    import sqlalchemy as sa
    from alembic import command

    from conveyor.db.engine import create_sync_engine
    from conveyor.db.migrate import alembic_config, upgrade_to

    def tables() -> set[str]:
        engine = create_sync_engine(empty_database_url)
        try:
            return set(sa.inspect(engine).get_table_names())
        finally:
            engine.dispose()

    upgrade_to(empty_database_url, "0016")
    assert "step_caches" not in tables()
    upgrade_to(empty_database_url)
    assert "step_caches" in tables()
    config = alembic_config()
    engine = create_sync_engine(empty_database_url)
    try:
        with engine.begin() as connection:
            config.attributes["connection"] = connection
            command.downgrade(config, "0016")
    finally:
        engine.dispose()
    assert "step_caches" not in tables() and "cache_entries" in tables()
