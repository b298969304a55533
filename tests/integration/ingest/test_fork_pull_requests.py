"""Pull requests from forks (docs/design/approvals.md §6): a signed GitHub `pull_request` whose head repository
differs from the base is held until approved, runs without secrets once approved, or with `refuse` starts no
run and the delivery says why. On SQLite and PostgreSQL."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from conveyor.db.tables import dispatch_queue, events, jobs, runs
from tests.fakes.github import FakeGitHub
from tests.support.git_sources import git_source, signed_post
from tests.support.github_ingest import add_github_source, post, processed
from tests.support.inprocess import InProcessServer
from tests.support.repos import git, make_repo

PR_WORKFLOW = """
from conveyor import pr, workflow

checks = workflow("checks", on=[pr(target=["main"])])

@checks.job(runs_on=["linux"])
def test(ctx):
    ctx.sh(["echo", "test"])
"""


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "repo", {"checks": PR_WORKFLOW})


def pr_payload(repo: Path, head_repo: str, number: int = 7) -> dict[str, Any]:
    sha = git(repo, "rev-parse", "HEAD")
    return {
        "action": "opened",
        "number": number,
        "repository": {"full_name": "acme/app", "default_branch": "main"},
        "sender": {"login": "stranger"},
        "pull_request": {
            "number": number,
            "base": {"ref": "main", "sha": sha, "repo": {"full_name": "acme/app"}},
            "head": {"ref": "patch-1", "sha": sha, "repo": {"full_name": head_repo}},
        },
    }


async def set_policy(server: InProcessServer, source_id: str, policy: str) -> None:
    answer = await server.client.patch(
        f"/api/v1/admin/sources/{source_id}", json={"fork_pull_requests": policy}, headers=server.auth()
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["fork_pull_requests"] == policy


async def jobs_of(server: InProcessServer, run_id: str) -> list[dict[str, Any]]:
    async with server.state.db.read() as conn:
        return [dict(r._mapping) for r in await conn.execute(select(jobs).where(jobs.c.run_id == run_id))]


async def test_a_forks_pull_request_is_held_until_approved_then_queued(
    server: InProcessServer, github: FakeGitHub, repo: Path
) -> None:
    source = await add_github_source(server, github)
    assert source["fork_pull_requests"] == "hold"
    answer = await post(
        server, source["id"], pr_payload(repo, "stranger/app"), event="pull_request", delivery="f-1"
    )
    assert answer.status_code == 202, answer.text
    delivery = await processed(server, answer.json()["delivery"])
    assert delivery["status"] == "processed" and len(delivery["runs"]) == 1
    run_id = delivery["runs"][0]
    [job] = await jobs_of(server, run_id)
    assert (job["status"], job["reason"]) == ("waiting_approval", "held: fork pull request")
    async with server.state.db.read() as conn:
        assert (await conn.execute(select(runs.c.held).where(runs.c.id == run_id))).scalar_one() == (
            "fork pull request"
        )
        requested = (
            await conn.execute(select(events.c.payload).where(events.c.name == "conveyor.approval.requested"))
        ).all()
    assert [(e.payload["job_id"], e.payload["reason"]) for e in requested] == [
        (job["id"], "held: fork pull request")
    ]
    async with server.state.db.read() as conn:
        assert (
            await conn.execute(select(dispatch_queue).where(dispatch_queue.c.job_id == job["id"]))
        ).first() is None
    auditor = await server.mint("auditor")
    refused = await server.client.post(
        f"/api/v1/admin/runs/{run_id}/jobs/{job['id']}/approve", headers=server.auth(auditor)
    )
    assert refused.status_code == 403
    operator = await server.mint("operator")
    approved = await server.client.post(
        f"/api/v1/admin/runs/{run_id}/jobs/{job['id']}/approve",
        json={"comment": "read the diff"},
        headers=server.auth(operator),
    )
    assert approved.status_code == 200, approved.text
    assert approved.json()["status"] == "queued"
    async with server.state.db.read() as conn:
        assert (await conn.execute(select(runs.c.held).where(runs.c.id == run_id))).scalar_one() is None
        assert (
            await conn.execute(select(dispatch_queue).where(dispatch_queue.c.job_id == job["id"]))
        ).first()


async def test_a_pull_request_from_the_same_repository_is_not_held(
    server: InProcessServer, github: FakeGitHub, repo: Path
) -> None:
    source = await add_github_source(server, github)
    answer = await post(
        server, source["id"], pr_payload(repo, "acme/app"), event="pull_request", delivery="s-1"
    )
    delivery = await processed(server, answer.json()["delivery"])
    [job] = await jobs_of(server, delivery["runs"][0])
    assert job["status"] == "queued"


async def test_run_without_secrets_queues_a_forks_run_at_once(
    server: InProcessServer, github: FakeGitHub, repo: Path
) -> None:
    source = await add_github_source(server, github)
    await set_policy(server, source["id"], "run-without-secrets")
    answer = await post(
        server, source["id"], pr_payload(repo, "stranger/app"), event="pull_request", delivery="r-1"
    )
    delivery = await processed(server, answer.json()["delivery"])
    [job] = await jobs_of(server, delivery["runs"][0])
    assert job["status"] == "queued"


async def test_refuse_creates_no_run_and_the_delivery_says_why(
    server: InProcessServer, github: FakeGitHub, repo: Path
) -> None:
    source = await add_github_source(server, github)
    await set_policy(server, source["id"], "refuse")
    answer = await post(
        server, source["id"], pr_payload(repo, "stranger/app"), event="pull_request", delivery="x-1"
    )
    assert answer.status_code == 202
    delivery = await processed(server, answer.json()["delivery"])
    assert (delivery["status"], delivery["skipped"], delivery["runs"]) == ("processed", "fork", [])
    assert "fork_pull_requests=refuse" in delivery["error"]
    async with server.state.db.read() as conn:
        assert (await conn.execute(select(runs.c.id))).first() is None


async def test_an_unknown_policy_is_refused_naming_the_field(
    server: InProcessServer, github: FakeGitHub
) -> None:
    source = await add_github_source(server, github)
    answer = await server.client.patch(
        f"/api/v1/admin/sources/{source['id']}",
        json={"fork_pull_requests": "sometimes"},
        headers=server.auth(),
    )
    assert answer.status_code == 422 and "fork_pull_requests" in answer.json()["detail"]


async def test_a_gitea_pull_request_from_a_fork_is_held_too(server: InProcessServer, tmp_path: Path) -> None:
    source_id, _ = await git_source(server, tmp_path, {"checks": PR_WORKFLOW}, repo="acme/app")
    payload = pr_payload(tmp_path / "origin", "stranger/app")
    row_id = await signed_post(server, source_id, payload, event="pull_request", delivery="g-1")
    delivery = await processed(server, row_id)
    assert delivery["status"] == "processed" and len(delivery["runs"]) == 1, delivery
    [job] = await jobs_of(server, delivery["runs"][0])
    assert (job["status"], job["reason"]) == ("waiting_approval", "held: fork pull request")
