"""`report: checks` (docs/design/execution.md §10): the reporter creates a check run at the first report and
PATCHes it by its id; a re-run on the same SHA gets a new check run; 5xx answers back off and retry.

The reporter runs in this process against the fake GitHub on a real socket, reading and writing
`status_reports` rows on each database; the requests the fake accepted are asserted exactly.
"""

import functools
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import select, update

from conveyor.artifacts import store as artifact_store
from conveyor.artifacts.summary import job_test_summary
from conveyor.db.engine import Database
from conveyor.db.tables import status_reports
from conveyor.execution import reports
from conveyor.ingest import store
from conveyor.ingest.providers.base import SourceRow
from conveyor.ingest.providers.github import GitHubProvider
from conveyor.ingest.reporter import StatusReporter
from conveyor.model.ids import new_id, utc_now
from tests.fakes.github import CheckRunRequest, FakeGitHub
from tests.support.repos import git

RUN_CONTEXT = "conveyor/ci"
JOB_CONTEXT = "conveyor/ci/build"


async def _token(_source_id: str, name: str) -> str | None:
    return "ghp_fake" if name == "api_token" else None


async def _source(db: Database, github: FakeGitHub, report: str = "checks") -> SourceRow:
    async with db.transaction() as conn:
        return await store.insert_source(
            conn,
            {
                "org_id": "default",
                "name": "acme/app",
                "kind": "github",
                "routing_key": "github:acme/app",
                "repo": "acme/app",
                "api_url": github.url,
                "verify": "hmac",
                "report": report,
            },
        )


def _reporter(db: Database) -> StatusReporter:
    return StatusReporter(db, {"github": GitHubProvider(_token)}, poll_s=60)


async def _write(
    db: Database,
    source: SourceRow,
    sha: str,
    context: str,
    run_id: str,
    status: str,
    job_id: str | None = None,
) -> None:
    async with db.transaction() as conn:
        await reports.upsert_report(
            conn,
            source_id=source.id,
            sha=sha,
            context=context,
            run_id=run_id,
            job_id=job_id,
            status=status,
            target_url=f"https://ci.example/ui/runs/{run_id}",
        )


async def _row(db: Database, context: str) -> dict[str, Any]:
    async with db.read() as conn:
        row = (await conn.execute(select(status_reports).where(status_reports.c.context == context))).one()
    return dict(row._mapping)


def _body(context: str, status: str, title: str, run_id: str, reference: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": context,
        "status": status,
        "output": {"title": title, "summary": title},
        "details_url": f"https://ci.example/ui/runs/{run_id}",
        "external_id": reference,
        **extra,
    }


async def test_a_check_run_is_created_then_patched_to_success(
    database: Database, repo: Path, github: FakeGitHub
) -> None:
    sha = git(repo, "rev-parse", "HEAD")
    source = await _source(database, github)
    reporter = _reporter(database)
    run_id, job_id = new_id(), new_id()
    await _write(database, source, sha, RUN_CONTEXT, run_id, "queued")
    assert await reporter.send_due() == 1
    await _write(database, source, sha, RUN_CONTEXT, run_id, "running")
    await _write(database, source, sha, JOB_CONTEXT, run_id, "running", job_id)
    assert await reporter.send_due() == 2
    await _write(database, source, sha, JOB_CONTEXT, run_id, "success", job_id)
    await _write(database, source, sha, RUN_CONTEXT, run_id, "success")
    assert await reporter.send_due() == 2
    assert await reporter.send_due() == 0

    assert github.check_run_requests == [
        CheckRunRequest(
            "POST", "acme/app", 1001, _body(RUN_CONTEXT, "queued", "Queued", run_id, run_id, head_sha=sha)
        ),
        CheckRunRequest(
            "PATCH", "acme/app", 1001, _body(RUN_CONTEXT, "in_progress", "Running", run_id, run_id)
        ),
        CheckRunRequest(
            "POST",
            "acme/app",
            1002,
            _body(JOB_CONTEXT, "in_progress", "Running", run_id, job_id, head_sha=sha),
        ),
        CheckRunRequest(
            "PATCH",
            "acme/app",
            1002,
            _body(JOB_CONTEXT, "completed", "Succeeded", run_id, job_id, conclusion="success"),
        ),
        CheckRunRequest(
            "PATCH",
            "acme/app",
            1001,
            _body(RUN_CONTEXT, "completed", "Succeeded", run_id, run_id, conclusion="success"),
        ),
    ]
    assert github.statuses == []
    assert github.check_runs[1001]["status"] == "completed" and github.check_runs[1001]["head_sha"] == sha
    assert (await _row(database, RUN_CONTEXT))["external_id"] == "1001"
    assert (await _row(database, JOB_CONTEXT))["external_id"] == "1002"


async def test_failure_timeout_and_cancellation_conclude_the_check_run(
    database: Database, repo: Path, github: FakeGitHub
) -> None:
    sha = git(repo, "rev-parse", "HEAD")
    source = await _source(database, github)
    reporter = _reporter(database)
    run_id = new_id()
    jobs = {"failed": new_id(), "timed_out": new_id(), "cancelled": new_id()}
    for status, job_id in jobs.items():
        await _write(database, source, sha, f"conveyor/ci/{status}", run_id, "running", job_id)
    assert await reporter.send_due() == 3
    for status, job_id in jobs.items():
        await _write(database, source, sha, f"conveyor/ci/{status}", run_id, status, job_id)
    assert await reporter.send_due() == 3

    patches = {r.body["name"]: r.body for r in github.check_run_requests if r.method == "PATCH"}
    assert patches == {
        "conveyor/ci/failed": _body(
            "conveyor/ci/failed", "completed", "Failed", run_id, jobs["failed"], conclusion="failure"
        ),
        "conveyor/ci/timed_out": _body(
            "conveyor/ci/timed_out",
            "completed",
            "Timed out",
            run_id,
            jobs["timed_out"],
            conclusion="timed_out",
        ),
        "conveyor/ci/cancelled": _body(
            "conveyor/ci/cancelled",
            "completed",
            "Cancelled",
            run_id,
            jobs["cancelled"],
            conclusion="cancelled",
        ),
    }
    assert [r.method for r in github.check_run_requests] == ["POST"] * 3 + ["PATCH"] * 3
    assert {run["conclusion"] for run in github.check_runs.values()} == {"failure", "timed_out", "cancelled"}


async def test_a_rerun_on_the_same_sha_creates_a_new_check_run(
    database: Database, repo: Path, github: FakeGitHub
) -> None:
    sha = git(repo, "rev-parse", "HEAD")
    source = await _source(database, github)
    reporter = _reporter(database)
    first = new_id()
    await _write(database, source, sha, RUN_CONTEXT, first, "queued")
    await reporter.send_due()
    await _write(database, source, sha, RUN_CONTEXT, first, "failed")
    await reporter.send_due()
    second = new_id()
    await _write(database, source, sha, RUN_CONTEXT, second, "queued")
    assert (await _row(database, RUN_CONTEXT))["external_id"] is None
    await reporter.send_due()
    await _write(database, source, sha, RUN_CONTEXT, second, "success")
    await reporter.send_due()
    # A late transition of the first run leaves the second run's row and check run alone.
    await _write(database, source, sha, RUN_CONTEXT, first, "cancelled")
    assert await reporter.send_due() == 0

    assert [(r.method, r.check_run_id, r.body["external_id"]) for r in github.check_run_requests] == [
        ("POST", 1001, first),
        ("PATCH", 1001, first),
        ("POST", 1002, second),
        ("PATCH", 1002, second),
    ]
    assert github.check_runs[1001]["conclusion"] == "failure"
    assert github.check_runs[1002]["conclusion"] == "success"
    assert (await _row(database, RUN_CONTEXT))["external_id"] == "1002"


async def test_a_rerun_written_while_the_first_check_run_is_being_created_gets_its_own(
    database: Database, repo: Path, github: FakeGitHub
) -> None:
    sha = git(repo, "rev-parse", "HEAD")
    source = await _source(database, github)
    first, second = new_id(), new_id()
    await _write(database, source, sha, RUN_CONTEXT, first, "queued")
    being_sent = await _row(database, RUN_CONTEXT)
    await _write(database, source, sha, RUN_CONTEXT, second, "queued")
    async with database.transaction() as conn:
        await reports.mark_sent(conn, being_sent, "1001")
    row = await _row(database, RUN_CONTEXT)
    assert row["run_id"] == second and row["external_id"] is None
    assert row["sent_version"] < row["version"]


async def test_a_5xx_backs_off_then_the_same_request_is_sent(
    database: Database, repo: Path, github: FakeGitHub
) -> None:
    sha = git(repo, "rev-parse", "HEAD")
    source = await _source(database, github)
    reporter = _reporter(database)
    run_id = new_id()
    await _write(database, source, sha, RUN_CONTEXT, run_id, "queued")
    github.fail_next.append(502)
    before = utc_now()
    assert await reporter.send_due() == 0
    row = await _row(database, RUN_CONTEXT)
    assert row["attempts"] == 1 and row["sent_version"] == 0 and row["external_id"] is None
    assert row["next_attempt_at"] >= before + timedelta(seconds=5)
    assert github.requests == ["POST /repos/acme/app/check-runs"] and github.check_run_requests == []
    # Not due yet: nothing is sent.
    assert await reporter.send_due() == 0
    assert len(github.requests) == 1
    # The back-off elapses (moved in the row instead of waiting 5 s): the same creation is sent.
    async with database.transaction() as conn:
        await conn.execute(update(status_reports).values(next_attempt_at=utc_now()))
    assert await reporter.send_due() == 1
    assert github.check_run_requests == [
        CheckRunRequest(
            "POST", "acme/app", 1001, _body(RUN_CONTEXT, "queued", "Queued", run_id, run_id, head_sha=sha)
        )
    ]
    # A 5xx on an update retries the PATCH of the same check run, never a second creation.
    await _write(database, source, sha, RUN_CONTEXT, run_id, "success")
    github.fail_next.append(503)
    assert await reporter.send_due() == 0
    async with database.transaction() as conn:
        await conn.execute(update(status_reports).values(next_attempt_at=utc_now()))
    assert await reporter.send_due() == 1
    assert github.requests[-2:] == ["PATCH /repos/acme/app/check-runs/1001"] * 2
    assert [(r.method, r.check_run_id) for r in github.check_run_requests] == [
        ("POST", 1001),
        ("PATCH", 1001),
    ]
    assert github.check_run_requests[-1].body["conclusion"] == "success"


async def test_a_statuses_source_still_posts_commit_statuses(
    database: Database, repo: Path, github: FakeGitHub
) -> None:
    sha = git(repo, "rev-parse", "HEAD")
    source = await _source(database, github, report="statuses")
    run_id = new_id()
    await _write(database, source, sha, RUN_CONTEXT, run_id, "cancelled")
    assert await _reporter(database).send_due() == 1
    assert [(s.state, s.description) for s in github.statuses] == [("error", "Cancelled")]
    assert github.check_run_requests == []


async def _test_report(
    db: Database, run_id: str, job_id: str, name: str, failures: list[dict[str, str]]
) -> None:
    async with db.transaction() as conn:
        await artifact_store.insert_test_report(
            conn,
            {
                "id": new_id(),
                "run_id": run_id,
                "job_id": job_id,
                "artifact_id": None,
                "name": name,
                "passed": 3,
                "failed": len(failures),
                "skipped": 1,
                "errors": 0,
                "failures": failures,
                "created_at": utc_now(),
            },
        )


async def test_a_jobs_check_run_carries_its_test_summary(
    database: Database, repo: Path, github: FakeGitHub
) -> None:
    sha = git(repo, "rev-parse", "HEAD")
    source = await _source(database, github)
    reporter = _reporter(database)
    reporter.details = functools.partial(job_test_summary, database)
    run_id, job_id, other_job = new_id(), new_id(), new_id()
    await _test_report(
        database, run_id, job_id, "test-report", [{"name": "tests.test_math.test_divides", "message": "boom"}]
    )
    await _test_report(database, run_id, other_job, "other-report", [{"name": "tests.other", "message": ""}])
    await _write(database, source, sha, JOB_CONTEXT, run_id, "failed", job_id)
    await _write(database, source, sha, RUN_CONTEXT, run_id, "failed")
    assert await reporter.send_due() == 2

    bodies = {r.body["name"]: r.body for r in github.check_run_requests}
    assert bodies[JOB_CONTEXT]["output"] == {
        "title": "Failed",
        "summary": "Failed\n\n### Tests\n\n**`test-report`**: 3 passed, 1 failed, 1 skipped\n\n"
        "- `tests.test_math.test_divides` `boom`\n",
    }
    # The run's check run and the other job's report are not this job's.
    assert bodies[RUN_CONTEXT]["output"] == {"title": "Failed", "summary": "Failed"}


async def test_a_huge_test_summary_is_cut_to_what_github_accepts(
    database: Database, repo: Path, github: FakeGitHub
) -> None:
    sha = git(repo, "rev-parse", "HEAD")
    source = await _source(database, github)
    reporter = _reporter(database)
    reporter.details = functools.partial(job_test_summary, database)
    run_id, job_id = new_id(), new_id()
    for index in range(4):  # 4 reports × 50 failures × 1000 characters: far over GitHub's 65535
        failures = [{"name": f"t{index}.{n}." + "x" * 490, "message": "m" * 500} for n in range(50)]
        await _test_report(database, run_id, job_id, f"report-{index}", failures)
    await _write(database, source, sha, JOB_CONTEXT, run_id, "failed", job_id)
    assert await reporter.send_due() == 1
    [sent] = github.check_run_requests
    summary = sent.body["output"]["summary"]
    assert len(summary) <= 65535 and summary.startswith("Failed\n\n### Tests")
    assert summary.endswith("… (cut: the run page lists every report)\n")
    assert github.check_runs[sent.check_run_id]["conclusion"] == "failure"


async def test_a_summary_that_cannot_be_read_does_not_hold_the_report_back(
    database: Database, repo: Path, github: FakeGitHub
) -> None:
    sha = git(repo, "rev-parse", "HEAD")
    source = await _source(database, github)
    reporter = _reporter(database)

    async def broken(_run_id: str, _job_id: str | None) -> str | None:
        raise RuntimeError("the database went away")

    reporter.details = broken
    run_id, job_id = new_id(), new_id()
    await _write(database, source, sha, JOB_CONTEXT, run_id, "success", job_id)
    assert await reporter.send_due() == 1
    assert github.check_run_requests[0].body["output"] == {"title": "Succeeded", "summary": "Succeeded"}
