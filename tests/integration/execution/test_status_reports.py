"""Commit statuses: pending when the run is created, the final state when it ends (fake GitHub)."""

from pathlib import Path
from typing import Any

import httpx
import pytest

from conveyor.model import protocol as p
from tests.fakes.github import FakeGitHub, post_webhook, push_payload
from tests.support.dispatch_stage import FAST, SINGLE_WORKFLOW
from tests.support.processes import ServerProcess
from tests.support.protocol_agent import ScriptedAgent
from tests.support.repos import git, make_repo
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

SECRET = "status-secret"


def _push_head(server: ServerProcess, github: FakeGitHub, repo: Path, sha: str, **source: str) -> str:
    """Create the GitHub source (with `source`'s extra fields) and push `sha` through its webhook; an
    agent token for `linux`."""
    owner = server.owner_token()
    source_id = server.create_source(owner, github.source_body("acme/app", SECRET, **source))
    answer = server.admin(owner, "POST", "/agent-tokens", json={"labels": ["linux"]})
    assert answer.status_code == 201, answer.text
    payload = push_payload("acme/app", repo, ref="refs/heads/main", before="0" * 40, after=sha)
    assert post_webhook(f"{server.url}/webhooks/{source_id}", SECRET, "push", payload).status_code == 202
    return str(answer.json()["token"])


async def test_the_fake_github_receives_pending_then_success(database_url: str, tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"ci": SINGLE_WORKFLOW})
    sha = git(repo, "rev-parse", "HEAD")
    with FakeGitHub(repos={"acme/app": repo}) as github:
        server = ServerProcess(tmp_path / "home", database_url=database_url, env=FAST)
        try:
            server.wait_ready()
            token = _push_head(server, github, repo, sha)
            wait_until(
                lambda: any(
                    s.context == "conveyor/ci" and s.state == "pending" for s in github.statuses_for(sha)
                ),
                timeout=60,
                what="pending status",
            )
            agent = ScriptedAgent(server.url.replace("http://", "ws://") + "/ws", token)
            await agent.connect()
            dispatch = await agent.next_of(p.JobDispatch)
            await agent.accept(dispatch)
            await agent.wait_acked(await agent.finish(dispatch.job_id, "success"))
            wait_until(
                lambda: any(
                    s.context == "conveyor/ci" and s.state == "success" for s in github.statuses_for(sha)
                ),
                timeout=60,
                what="final success status",
            )
            job_context = [s for s in github.statuses_for(sha) if s.context == "conveyor/ci/build"]
            assert job_context and job_context[-1].state == "success"
            await agent.close()
        finally:
            server.stop()


async def test_report_checks_creates_check_runs_that_end_success(database_url: str, tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"ci": SINGLE_WORKFLOW})
    sha = git(repo, "rev-parse", "HEAD")
    with FakeGitHub(repos={"acme/app": repo}) as github:
        server = ServerProcess(tmp_path / "home", database_url=database_url, env=FAST)
        try:
            server.wait_ready()
            token = _push_head(server, github, repo, sha, report="checks")

            def run_check() -> dict[str, object] | None:
                return next((c for c in github.check_runs.values() if c["name"] == "conveyor/ci"), None)

            wait_until(lambda: run_check() is not None, timeout=60, what="the workflow's check run")
            agent = ScriptedAgent(server.url.replace("http://", "ws://") + "/ws", token)
            await agent.connect()
            dispatch = await agent.next_of(p.JobDispatch)
            await agent.accept(dispatch)
            await agent.wait_acked(await agent.finish(dispatch.job_id, "success"))
            wait_until(
                lambda: (
                    all(c["conclusion"] == "success" for c in github.check_runs.values())
                    and len(github.check_runs) == 2
                ),
                timeout=60,
                what="both check runs concluded success",
            )
            assert sorted(c["name"] for c in github.check_runs.values()) == [
                "conveyor/ci",
                "conveyor/ci/build",
            ]
            assert all(c["head_sha"] == sha for c in github.check_runs.values())
            creations = [r for r in github.check_run_requests if r.method == "POST"]
            assert len(creations) == 2 and github.statuses == []
            first = next(r for r in creations if r.body["name"] == "conveyor/ci")
            assert first.body["status"] == "queued"
            await agent.close()
        finally:
            server.stop()


JUNIT = (
    b'<testsuite name="unit" tests="2"><testcase classname="tests.test_math" name="test_adds"/>'
    b'<testcase classname="tests.test_math" name="test_divides"><failure message="boom"/></testcase></testsuite>'
)


async def test_a_jobs_check_run_carries_the_test_summary_its_job_recorded(
    database_url: str, tmp_path: Path
) -> None:
    """The server plugs the artifacts' summary into the reporter (docs/design/artifacts.md §7): a job that
    recorded a JUnit summary with its credential ends with the failing test in its check run's summary."""
    repo = make_repo(tmp_path / "repo", {"ci": SINGLE_WORKFLOW})
    sha = git(repo, "rev-parse", "HEAD")
    with FakeGitHub(repos={"acme/app": repo}) as github:
        server = ServerProcess(tmp_path / "home", database_url=database_url, env=FAST)
        try:
            server.wait_ready()
            token = _push_head(server, github, repo, sha, report="checks")
            agent = ScriptedAgent(server.url.replace("http://", "ws://") + "/ws", token)
            await agent.connect()
            dispatch = await agent.next_of(p.JobDispatch)
            await agent.accept(dispatch)
            assert dispatch.artifacts is not None
            job = {"Authorization": f"Bearer {dispatch.artifacts.token}"}
            async with httpx.AsyncClient(base_url=server.url, headers=job, timeout=30) as client:
                stored = (await client.put(f"/api/v1/uploads/{dispatch.job_id}", content=JUNIT)).json()
                committed = await client.post(
                    f"/api/v1/jobs/{dispatch.job_id}/artifacts",
                    json={
                        "name": "test-report",
                        "upload_id": stored["upload_id"],
                        "sha256": stored["sha256"],
                        "size": stored["size"],
                        "format": "file",
                        "filename": "junit.xml",
                    },
                )
                assert committed.status_code == 201, committed.text
                recorded = await client.post(
                    f"/api/v1/jobs/{dispatch.job_id}/test-reports",
                    json={
                        "artifact": "test-report",
                        "passed": 1,
                        "failed": 1,
                        "skipped": 0,
                        "errors": 0,
                        "failures": [{"name": "tests.test_math.test_divides", "message": "boom"}],
                    },
                )
                assert recorded.status_code == 201, recorded.text
            await agent.wait_acked(await agent.finish(dispatch.job_id, "failed"))

            def job_check() -> dict[str, Any] | None:
                found = next(
                    (c for c in github.check_runs.values() if c["name"] == "conveyor/ci/build"), None
                )
                return found if found and found["conclusion"] == "failure" else None

            concluded = wait_until(job_check, timeout=60, what="the job's check run concluded")
            assert concluded["output"]["summary"] == (
                "Failed\n\n### Tests\n\n**`test-report`**: 1 passed, 1 failed, 0 skipped\n\n"
                "- `tests.test_math.test_divides` `boom`\n"
            )
            run_check = next(c for c in github.check_runs.values() if c["name"] == "conveyor/ci")
            assert "### Tests" not in run_check["output"]["summary"]
            await agent.close()
        finally:
            server.stop()
