"""GitHub-format webhooks: durable intake, dedup, refusals that write nothing, runs, statuses."""

from pathlib import Path
from typing import Any

from sqlalchemy import func, select

from conveyor.db.tables import deliveries, dispatch_queue, jobs, runs
from conveyor.ingest.signatures import github_signature
from tests.fakes.github import FakeGitHub, push_payload
from tests.support.github_ingest import SECRET, add_github_source, post, processed
from tests.support.inprocess import InProcessServer
from tests.support.repos import commit_all, git
from tests.support.waiting import async_wait_until


async def counts(server: InProcessServer) -> list[int]:
    found = []
    async with server.state.db.read() as conn:
        for table in (deliveries, runs, jobs, dispatch_queue):
            found.append((await conn.execute(select(func.count()).select_from(table))).scalar_one())
    return found


async def test_signed_push_is_accepted_and_creates_one_run_per_matched_workflow(
    server: InProcessServer, github: FakeGitHub, repo: Path
) -> None:
    source = await add_github_source(server, github)
    before = git(repo, "rev-parse", "HEAD")
    (repo / "README.md").write_text("changed\n")
    sha = commit_all(repo, "touch the readme")
    payload = push_payload("acme/app", repo, ref="refs/heads/main", before=before, after=sha)
    answer = await post(server, source["id"], payload)
    assert answer.status_code == 202, answer.text
    assert answer.json()["status"] == "accepted"
    row = await processed(server, answer.json()["delivery"])
    assert row["status"] == "processed"
    assert len(row["runs"]) == 1
    docs = next(w for w in row["decisions"]["workflows"] if w["workflow"] == "docs")
    assert docs["matched"] is False
    run = (await server.client.get(f"/api/v1/admin/runs/{row['runs'][0]}", headers=server.auth())).json()
    assert run["workflow"] == "ci" and run["sha"] == sha and run["number"] == 1
    assert {j["name"]: j["status"] for j in run["jobs"]} == {"build": "queued", "test": "pending"}
    assert run["trigger_trace"]["workflow"]["matched"] is True


async def test_redelivery_and_refused_deliveries_change_nothing(
    server: InProcessServer, github: FakeGitHub, repo: Path
) -> None:
    source = await add_github_source(server, github)
    sha = git(repo, "rev-parse", "HEAD")
    payload = push_payload("acme/app", repo, ref="refs/heads/main", before="0" * 40, after=sha)
    first = await post(server, source["id"], payload, delivery="same")
    await processed(server, first.json()["delivery"])
    before = await counts(server)

    again = await post(server, source["id"], payload, delivery="same")
    assert again.status_code == 200
    assert again.json() == {"status": "duplicate", "delivery": first.json()["delivery"]}
    bad = await post(server, source["id"], payload, delivery="other", secret="wrong")
    assert bad.status_code == 401 and bad.json()["error"] == "bad_signature"
    unsigned = await post(
        server, source["id"], payload, delivery="other2", headers={"X-Hub-Signature-256": ""}
    )
    assert unsigned.status_code == 401
    no_delivery_header = await post(server, source["id"], payload, headers={"X-GitHub-Delivery": ""})
    assert (
        no_delivery_header.status_code == 400 and "X-GitHub-Delivery" in no_delivery_header.json()["detail"]
    )
    unknown = await post(server, "no-such-source", payload)
    assert unknown.status_code == 404 and unknown.json()["error"] == "unknown_source"
    big = await post(server, source["id"], {**payload, "padding": "x" * 70000}, delivery="big")
    assert big.status_code == 413
    malformed = await server.client.post(
        f"/webhooks/{source['id']}",
        content=b"{not json",
        headers={
            "X-GitHub-Event": "push",
            "X-GitHub-Delivery": "m",
            "X-Hub-Signature-256": github_signature(SECRET, b"{not json"),
        },
    )
    assert malformed.status_code == 400
    assert await counts(server) == before


async def test_push_to_docs_matches_the_paths_filter(
    server: InProcessServer, github: FakeGitHub, repo: Path
) -> None:
    source = await add_github_source(server, github)
    before = git(repo, "rev-parse", "HEAD")
    (repo / "docs").mkdir()
    (repo / "docs" / "a.md").write_text("hello\n")
    after = commit_all(repo, "docs")
    payload = push_payload("acme/app", repo, ref="refs/heads/main", before=before, after=after)
    answer = await post(server, source["id"], payload)
    row = await processed(server, answer.json()["delivery"])
    async with server.state.db.read() as conn:
        names = sorted(
            r.workflow
            for r in await conn.execute(select(runs.c.workflow).where(runs.c.delivery_id == row["id"]))
        )
    assert names == ["ci", "docs"]


async def test_skip_ci_creates_no_run_and_the_delivery_says_why(
    server: InProcessServer, github: FakeGitHub, repo: Path
) -> None:
    source = await add_github_source(server, github)
    before = git(repo, "rev-parse", "HEAD")
    (repo / "notes.txt").write_text("x\n")
    after = commit_all(repo, "tweak readme [skip ci]")
    payload = push_payload("acme/app", repo, ref="refs/heads/main", before=before, after=after)
    answer = await post(server, source["id"], payload)
    row = await processed(server, answer.json()["delivery"])
    assert row["skipped"] == "skip-ci" and row["runs"] == [] and row["run_count"] == 0


async def test_commit_without_lock_is_recorded_as_lock_missing(
    server: InProcessServer, github: FakeGitHub, repo: Path
) -> None:
    source = await add_github_source(server, github)
    git(repo, "rm", "-q", ".conveyor/conveyor.lock.json")
    sha = commit_all(repo, "drop the lock")
    payload = push_payload("acme/app", repo, ref="refs/heads/main", before="0" * 40, after=sha)
    row = await processed(server, (await post(server, source["id"], payload)).json()["delivery"])
    assert row["status"] == "lock_missing" and row["runs"] == []


async def test_invalid_lock_fails_one_visible_run(
    server: InProcessServer, github: FakeGitHub, repo: Path
) -> None:
    source = await add_github_source(server, github)
    (repo / ".conveyor" / "conveyor.lock.json").write_text('{"schema_version": 99, "workflows": []}')
    sha = commit_all(repo, "lock from the future")
    payload = push_payload("acme/app", repo, ref="refs/heads/main", before="0" * 40, after=sha)
    row = await processed(server, (await post(server, source["id"], payload)).json()["delivery"])
    assert row["status"] == "lock_invalid"
    run = (await server.client.get(f"/api/v1/admin/runs/{row['runs'][0]}", headers=server.auth())).json()
    assert run["status"] == "failed" and run["reason"].startswith("lock_schema_too_new")


async def test_manual_run_validates_inputs_and_reports_pending(
    server: InProcessServer, github: FakeGitHub, repo: Path
) -> None:
    source = await add_github_source(server, github)
    missing = await server.client.post(
        "/api/v1/admin/runs",
        json={"source": source["id"], "workflow": "ci", "inputs": {}},
        headers=server.auth(),
    )
    assert missing.status_code == 400
    assert missing.json()["error"] == "invalid_inputs" and "target" in missing.json()["detail"]
    started = await server.client.post(
        "/api/v1/admin/runs",
        json={"source": source["id"], "workflow": "ci", "inputs": {"target": "prod"}},
        headers=server.auth(),
    )
    assert started.status_code == 201, started.text
    run = (
        await server.client.get(f"/api/v1/admin/runs/{started.json()['id']}", headers=server.auth())
    ).json()
    assert run["event"]["type"] == "dispatch"
    assert run["event"]["payload"]["inputs"] == {"target": "prod", "level": 3}
    sha = git(repo, "rev-parse", "HEAD")

    def pending_reported() -> bool:
        return any(s.state == "pending" and s.context == "conveyor/ci" for s in github.statuses_for(sha))

    await async_wait_until(_sync(pending_reported), timeout=20, what="pending status at the fake GitHub")


def _sync(check: Any) -> Any:
    async def wrapped() -> Any:
        return check()

    return wrapped
