"""The run page's artifacts and test summaries, and the download route that streams an artifact through
the dashboard session behind `artifact.read` (docs/design/artifacts.md §7, docs/dashboard.md)."""

from __future__ import annotations

import hashlib
import os
import re

from sqlalchemy import select

from conveyor.db.tables import access_log
from tests.integration.artifacts.conftest import Job, job_with_token, publish
from tests.integration.dashboard.conftest import signed_in
from tests.support.inprocess import InProcessServer

DATA = os.urandom(2 * 1024 * 1024 + 5)


async def _run_with_outputs(server: InProcessServer) -> Job:
    """A run whose job made the artifact `dist` and a JUnit summary with two failing tests."""
    job = await job_with_token(server)
    await publish(server.client, job, "dist", DATA)
    await publish(server.client, job, "test-report", b"<testsuite/>")
    recorded = await server.client.post(
        f"/api/v1/jobs/{job.job_id}/test-reports",
        json={
            "artifact": "test-report",
            "passed": 7,
            "failed": 2,
            "skipped": 1,
            "errors": 0,
            "failures": [
                {"name": "tests.test_math.test_divides", "message": "ZeroDivisionError: boom"},
                {"name": "tests.test_x.<script>alert(1)</script>", "message": ""},
            ],
        },
        headers=job.auth(),
    )
    assert recorded.status_code == 201, recorded.text
    return job


async def test_the_run_page_lists_artifacts_and_failing_tests(server: InProcessServer) -> None:
    job = await _run_with_outputs(server)
    async with signed_in(server, server.owner_token) as browser:
        page = await browser.get(f"/ui/runs/{job.run_id}")
    assert page.status_code == 200
    html = page.text
    row = re.search(r'<tr data-artifact="dist">(.*?)</tr>', html, re.DOTALL)
    assert row, html
    cells = [
        re.sub(r"<[^>]+>", "", cell).strip()
        for cell in re.findall(r"<td>(.*?)</td>", row.group(1), re.DOTALL)
    ]
    assert cells[:3] == ["dist", "2.0 MiB", "build"]
    assert f'href="/ui/runs/{job.run_id}/artifacts/dist"' in row.group(1)
    assert "7 passed" in html and "2 failed" in html and "1 skipped" in html
    assert "tests.test_math.test_divides" in html and "ZeroDivisionError: boom" in html
    # A test's name is the job's text: it is escaped like a log line.
    assert "<script>alert(1)</script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html


async def test_the_download_link_streams_the_bytes_as_the_session_and_is_access_logged(
    server: InProcessServer,
) -> None:
    job = await _run_with_outputs(server)
    link = f"/ui/runs/{job.run_id}/artifacts/dist"
    async with signed_in(server, server.owner_token) as browser:
        whole = await browser.get(link)
        assert whole.status_code == 200
        assert whole.content == DATA
        assert whole.headers["etag"] == f'"{hashlib.sha256(DATA).hexdigest()}"'
        assert whole.headers["content-disposition"] == "attachment; filename*=UTF-8''dist.bin"
        assert "default-src 'none'" in whole.headers["content-security-policy"]
        part = await browser.get(link, headers={"Range": "bytes=10-19"})
        assert part.status_code == 206 and part.content == DATA[10:20]
        missing = await browser.get(f"/ui/runs/{job.run_id}/artifacts/nothing")
        assert missing.status_code == 404
        assert missing.headers["content-type"].startswith("text/html") and "nothing" in missing.text
    assert server.state.read_log is not None
    await server.state.read_log.flush()  # reads are logged in batches
    async with server.state.db.read() as conn:
        rows = (
            await conn.execute(select(access_log).where(access_log.c.action == "artifacts.download"))
        ).all()
    assert [(r.source, r.actor_role, r.status_code) for r in rows] == [
        ("dashboard", "owner", 200),
        ("dashboard", "owner", 206),
        ("dashboard", "owner", 404),
    ]


async def test_without_artifact_read_there_is_no_link_and_the_route_refuses(server: InProcessServer) -> None:
    job = await _run_with_outputs(server)
    link = f"/ui/runs/{job.run_id}/artifacts/dist"
    async with signed_in(server, await server.mint("operator")) as operator:
        page = await operator.get(f"/ui/runs/{job.run_id}")
        assert page.status_code == 200
        assert link not in page.text and "may not read artifacts (artifact.read)" in page.text
        # The test summary needs run.read only: an operator sees which tests fail.
        assert "tests.test_math.test_divides" in page.text
        refused = await operator.get(link)
        assert refused.status_code == 403
        assert refused.headers["content-type"].startswith("text/html")
        assert "artifact.read" in refused.text and DATA[:64] not in refused.content
    async with signed_in(server, await server.mint("auditor", routing_key="github:acme/other")) as scoped:
        assert (await scoped.get(link)).status_code == 404
    anonymous = await server.client.get(link)
    assert anonymous.status_code == 303
    assert anonymous.headers["location"] == f"/ui/sign-in?next=%2Fui%2Fruns%2F{job.run_id}%2Fartifacts%2Fdist"
