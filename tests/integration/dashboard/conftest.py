"""Fixtures for dashboard tests against the in-process app."""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from sqlalchemy import insert

from conveyor.db.engine import Database
from conveyor.db.tables import DEFAULT_ORG, job_needs, jobs, runs, steps
from conveyor.model.ids import new_id, utc_now
from tests.support.inprocess import InProcessServer

CSRF_RE = re.compile(r'name="csrf_token" value="([0-9a-f]{64})"')


@pytest.fixture
def server_env() -> dict[str, str]:
    """The `server` fixture's settings here: sign-in throttled after 3 failures."""
    return {"CONVEYOR_DASHBOARD_SIGN_IN_MAX_FAILURES": "3"}


@asynccontextmanager
async def signed_in(server: InProcessServer, token: str) -> AsyncIterator[httpx.AsyncClient]:
    """A separate browser-like client signed in with `token` (cookies kept)."""
    transport = httpx.ASGITransport(app=server.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        answer = await client.post("/ui/sign-in", data={"token": token, "next": "/ui/runs"})
        assert answer.status_code == 303, answer.text
        yield client


async def csrf_of(client: httpx.AsyncClient, page: str = "/ui/runs") -> str:
    """The CSRF value a page's forms carry."""
    answer = await client.get(page)
    assert answer.status_code == 200, answer.text
    found = CSRF_RE.search(answer.text)
    assert found, "no CSRF field on the page"
    return found.group(1)


async def insert_run(
    db: Database,
    *,
    ref: str = "refs/heads/main",
    status: str = "success",
    workflow: str = "ci",
    jobs_spec: list[dict[str, Any]] | None = None,
) -> str:
    """A run with jobs (`name`, `status`, `needs`, `steps`: [(name, status)]) written straight to the database."""
    now = utc_now()
    run_id = new_id()
    async with db.transaction() as conn:
        await conn.execute(
            insert(runs).values(
                id=run_id,
                org_id=DEFAULT_ORG,
                number=int(time.monotonic() * 1000) % 1_000_000,
                workflow=workflow,
                repo="acme/app",
                ref=ref,
                sha="a" * 40,
                routing_key="local:app",
                event={},
                status=status,
                created_at=now,
                started_at=now,
                finished_at=now if status in ("success", "failed", "cancelled") else None,
            )
        )
        for spec in jobs_spec or []:
            job_id = spec.get("id") or new_id()
            await conn.execute(
                insert(jobs).values(
                    id=job_id,
                    run_id=run_id,
                    org_id=DEFAULT_ORG,
                    name=spec["name"],
                    display_name=spec["name"],
                    status=spec.get("status", status),
                    runs_on={"labels": [], "exclude": []},
                    created_at=now,
                )
            )
            for need in spec.get("needs", []):
                await conn.execute(
                    insert(job_needs).values(job_id=job_id, upstream_name=need, run_on=["success"])
                )
            for index, (name, step_status) in enumerate(spec.get("steps", [])):
                await conn.execute(
                    insert(steps).values(
                        job_id=job_id, step_index=index, name=name, kind="step", status=step_status
                    )
                )
    return run_id
