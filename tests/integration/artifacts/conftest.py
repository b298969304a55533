"""An in-process coordinator with the filesystem blob store, and jobs holding artifact credentials."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from conveyor.artifacts.routes import ARTIFACTS
from conveyor.artifacts.service import ArtifactService
from conveyor.db.tables import dispatch_queue, jobs
from conveyor.execution.queue import set_job_token
from conveyor.model.job_tokens import mint_job_token
from conveyor.model.tokens import hash_token
from tests.support.inprocess import InProcessServer, in_process_server
from tests.support.queued import queue_job

# Short grace, so sweeps in tests reach what they must without waiting.
ENV = {"CONVEYOR_BLOB_GRACE_MS": "0"}


@dataclass
class Job:
    """A queued job and its artifact credential."""

    job_id: str
    run_id: str
    token: str

    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


@pytest.fixture
async def server(database_url: str, tmp_path: Path) -> AsyncIterator[InProcessServer]:
    async with in_process_server(database_url, tmp_path / "home", env=ENV) as found:
        yield found


def service_of(server: InProcessServer) -> ArtifactService:
    service = server.state.parts.need(ARTIFACTS)
    assert isinstance(service, ArtifactService)
    return service


async def job_with_token(server: InProcessServer) -> Job:
    """A queued job (its own run) whose current dispatch holds a fresh credential."""
    db = server.state.db
    job_id = await queue_job(db, "linux")
    token = mint_job_token()
    async with db.transaction() as conn:
        run_id = (await conn.execute(select(jobs.c.run_id).where(jobs.c.id == job_id))).scalar_one()
        attempts = (
            await conn.execute(select(dispatch_queue.c.attempts).where(dispatch_queue.c.job_id == job_id))
        ).scalar_one()
        assert await set_job_token(conn, job_id, attempts, hash_token(token))
    return Job(job_id, run_id, token)


async def upload(client: httpx.AsyncClient, job: Job, data: bytes, **headers: str) -> httpx.Response:
    return await client.put(f"/api/v1/uploads/{job.job_id}", content=data, headers={**job.auth(), **headers})


async def commit(
    client: httpx.AsyncClient, job: Job, name: str, stored: dict[str, Any], **extra: Any
) -> httpx.Response:
    body = {
        "name": name,
        "upload_id": stored["upload_id"],
        "sha256": stored["sha256"],
        "size": stored["size"],
        "format": "file",
        "filename": f"{name}.bin",
        **extra,
    }
    return await client.post(f"/api/v1/jobs/{job.job_id}/artifacts", json=body, headers=job.auth())


async def publish(
    client: httpx.AsyncClient, job: Job, name: str, data: bytes, **extra: Any
) -> dict[str, Any]:
    stored = await upload(client, job, data)
    assert stored.status_code == 201, stored.text
    assert stored.json()["sha256"] == hashlib.sha256(data).hexdigest()
    made = await commit(client, job, name, stored.json(), **extra)
    assert made.status_code == 201, made.text
    result: dict[str, Any] = made.json()
    return result
