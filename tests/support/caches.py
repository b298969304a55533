"""Cache requests of a job of the artifacts stage: the push event they belong to and a job holding a token."""

from __future__ import annotations

from typing import Any

from sqlalchemy import update

from conveyor.db.tables import runs
from tests.integration.artifacts.conftest import Job, job_with_token
from tests.support.inprocess import InProcessServer


def push_event(branch: str) -> dict[str, Any]:
    return {
        "type": "push",
        "repo": "acme/app",
        "source": "app",
        "ref": f"refs/heads/{branch}",
        "branch": branch,
        "default_branch": "main",
    }


async def job_for(server: InProcessServer, event: dict[str, Any]) -> Job:
    """A job with a live credential whose run was made by `event`."""
    job = await job_with_token(server)
    async with server.state.db.transaction() as conn:
        await conn.execute(update(runs).where(runs.c.id == job.run_id).values(repo="acme/app", event=event))
    return job
