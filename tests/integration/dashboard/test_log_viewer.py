"""The run page's log viewer and the raw log download, against the real in-process app (SQLite and
PostgreSQL): colours rendered and escaped, numbered lines with anchors and times, the setup step's git
lines folded, the failing step open, and `…/logs/raw` / `/ui/runs/<id>/jobs/<job>/log` behind log.read
and the token's scope."""

from __future__ import annotations

import re

from sqlalchemy import select

from conveyor.db.tables import access_log
from conveyor.execution.log_store import append_chunk
from conveyor.model.ids import new_id
from conveyor.model.protocol import LogLine
from tests.integration.dashboard.conftest import insert_run, signed_in
from tests.support.inprocess import InProcessServer

TS = 1_796_637_600_000  # 2026-12-07T10:00:00.000Z

SETUP_LINES = [
    ("sys", "job build on agent-1"),
    ("sys", "$ git init -q /work"),
    ("sys", "$ git fetch -q --depth 1 origin " + "a" * 40),
    ("out", "remote: counting objects"),
    ("sys", "requirements: none"),
]
FAILING_LINES = [
    ("out", "\x1b[32mtests/test_ok.py PASSED\x1b[0m"),
    ("out", "<script>alert(1)</script>"),
    ("err", "\x1b[1;31mFAILED\x1b[0m tests/test_x.py::test_divides"),
]


async def _write(
    server: InProcessServer, job_id: str, step: int, lines: list[tuple[str, str]], seq: int = 0
) -> None:
    async with server.state.db.transaction() as conn:
        result = await append_chunk(
            conn,
            job_id=job_id,
            step_index=step,
            seq=seq,
            lines=[LogLine(ts=TS + i, stream=stream, text=text) for i, (stream, text) in enumerate(lines)],
        )
        assert result.stored, result


async def _failed_run(server: InProcessServer) -> tuple[str, str]:
    job_id = new_id()
    run_id = await insert_run(
        server.state.db,
        status="failed",
        jobs_spec=[
            {
                "id": job_id,
                "name": "build",
                "status": "failed",
                "steps": [
                    ("setup", "success"),
                    ("lint", "success"),
                    ("pytest", "failed"),
                    ("deploy", "skipped"),
                ],
            }
        ],
    )
    await _write(server, job_id, 0, SETUP_LINES)
    await _write(server, job_id, 1, [("out", "lint ok")])
    await _write(server, job_id, 2, FAILING_LINES)
    return run_id, job_id


def _details(html: str, job_id: str, step: int) -> str:
    start = html.index(f'<details data-step="{job_id}:{step}"')
    return html[start : html.index("<summary", start)]


async def test_a_finished_job_s_log_is_rendered_numbered_timed_and_opened_at_the_failing_step(
    server: InProcessServer,
) -> None:
    run_id, job_id = await _failed_run(server)
    async with signed_in(server, server.owner_token) as browser:
        html = (await browser.get(f"/ui/runs/{run_id}")).text
    # Colours are spans, never escapes; the log's HTML is text.
    assert '<span class="ansi-fg-2">tests/test_ok.py PASSED</span>' in html
    assert '<span class="ansi-bold ansi-fg-1">FAILED</span> tests/test_x.py::test_divides' in html
    assert "\x1b" not in html and "[31m" not in html
    assert "<script>alert(1)</script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    # Numbered lines, each an anchor, with its time (shown on demand).
    anchor = f"log-{job_id}-2-3"
    assert f'<div class="line" id="{anchor}"><a class="ln" href="#{anchor}">3</a>' in html
    assert '<time class="ts" datetime="2026-12-07T10:00:00.002Z"' in html
    # The failing step is open, the others are closed; every started step's log is on the page.
    assert _details(html, job_id, 2).rstrip().endswith(" open>")
    for step in (0, 1, 3):
        assert not _details(html, job_id, step).rstrip().endswith(" open>")
    assert "lint ok" in html
    # Setup's git commands and their output are folded (closed), its other lines are not.
    setup = html[html.index(f'data-log-of="{job_id}:0"') : html.index(f'data-log-of="{job_id}:1"')]
    fold = setup[setup.index('<details class="fold"') : setup.index("</details>")]
    assert "$ git init -q /work" in fold and "remote: counting objects" in fold
    assert "requirements: none" not in fold and "job build on agent-1" not in fold
    assert '<details class="fold" data-fold>' in setup  # not open
    assert '<span class="fold-count">3</span>' in fold
    # The tools: search, times, and the raw download link.
    assert f'href="/ui/runs/{run_id}/jobs/{job_id}/log"' in html and "data-log-search" in html


async def test_setup_s_git_lines_are_folded_on_success_too(server: InProcessServer) -> None:
    job_id = new_id()
    run_id = await insert_run(
        server.state.db,
        jobs_spec=[{"id": job_id, "name": "b", "steps": [("setup", "success"), ("make", "success")]}],
    )
    await _write(server, job_id, 0, SETUP_LINES)
    async with signed_in(server, server.owner_token) as browser:
        html = (await browser.get(f"/ui/runs/{run_id}")).text
    assert '<details class="fold" data-fold><summary>git <span class="fold-count">3</span>' in html
    assert _details(html, job_id, 1).rstrip().endswith(" open>")  # the last step, as nothing failed


async def test_the_range_read_gives_each_line_s_time_only_when_asked(server: InProcessServer) -> None:
    run_id, job_id = await _failed_run(server)
    path = f"/api/v1/admin/runs/{run_id}/jobs/{job_id}/logs"
    plain = (await server.client.get(path, params={"step": 2}, headers=server.auth())).json()
    assert "times" not in plain
    timed = (
        await server.client.get(path, params={"step": 2, "timestamps": "true"}, headers=server.auth())
    ).json()
    assert timed["times"] == [
        "2026-12-07T10:00:00.000Z",
        "2026-12-07T10:00:00.001Z",
        "2026-12-07T10:00:00.002Z",
    ]
    job_view = (await server.client.get(path, params={"timestamps": "true"}, headers=server.auth())).json()
    lines = job_view["text"].split("\n")[:-1]
    assert len(job_view["times"]) == len(lines)
    assert [t for line, t in zip(lines, job_view["times"], strict=True) if line.startswith("── ")] == [
        None
    ] * 3
    skipped = (
        await server.client.get(
            path, params={"step": 2, "offset": 10_000, "timestamps": "true"}, headers=server.auth()
        )
    ).json()
    assert skipped["times"] == [] and skipped["text"] == ""


async def test_the_raw_log_is_the_whole_job_s_text_as_a_download(server: InProcessServer) -> None:
    run_id, job_id = await _failed_run(server)
    # More than one read window (1 MiB): the download is every byte, in order.
    big = [("out", f"{i:07d} " + "x" * 120) for i in range(9_000)]
    for seq in range(1, 4):
        await _write(server, job_id, 1, big, seq=seq)
    path = f"/api/v1/admin/runs/{run_id}/jobs/{job_id}/logs"
    answer = await server.client.get(path + "/raw", headers=server.auth())
    assert answer.status_code == 200
    assert answer.headers["content-type"] == "text/plain; charset=utf-8"
    assert re.fullmatch(r'attachment; filename="ci-\d+-build\.log"', answer.headers["content-disposition"])
    assert len(answer.content) > 3_000_000
    expected, offset = [], 0
    while True:
        window = (
            await server.client.get(
                path, params={"offset": offset, "limit_bytes": 1_048_576}, headers=server.auth()
            )
        ).json()
        if window["next_offset"] == offset:
            break
        expected.append(window["text"])
        offset = window["next_offset"]
    assert answer.text == "".join(expected)
    assert answer.text.startswith("── 0 setup ──\n[conveyor] job build on agent-1\n")
    assert "\x1b[1;31mFAILED\x1b[0m" in answer.text  # raw: the escapes stay, it is the log as written
    one_step = await server.client.get(path + "/raw", params={"step": 2}, headers=server.auth())
    assert one_step.text.splitlines()[1] == "<script>alert(1)</script>"
    assert one_step.headers["content-disposition"].endswith('-build-step-2.log"')
    # The page shows the first 256 KiB of the long step and links the whole log.
    async with signed_in(server, server.owner_token) as browser:
        html = (await browser.get(f"/ui/runs/{run_id}")).text
    note = html[html.index('<p class="meta log-truncated">') :]
    assert re.search(r"the first 25[56]\.\d KiB of this step", note), note[:200]
    assert f'href="/ui/runs/{run_id}/jobs/{job_id}/log"' in note[: note.index("</p>")]
    assert html.count("log-truncated") == 1  # only the long step


async def test_the_raw_log_needs_a_token_in_scope_and_a_known_job(server: InProcessServer) -> None:
    run_id, job_id = await _failed_run(server)
    path = f"/api/v1/admin/runs/{run_id}/jobs/{job_id}/logs/raw"
    assert (await server.client.get(path)).status_code == 401
    other_source = await server.mint("operator", routing_key="local:other")
    refused = await server.client.get(path, headers=server.auth(other_source))
    assert refused.status_code == 404 and refused.json()["error"] == "not_found"
    in_scope = await server.mint("auditor", routing_key="local:app")
    assert (await server.client.get(path, headers=server.auth(in_scope))).status_code == 200
    unknown = await server.client.get(
        f"/api/v1/admin/runs/{run_id}/jobs/{new_id()}/logs/raw", headers=server.auth()
    )
    assert unknown.status_code == 404
    bad_step = await server.client.get(path, params={"step": -1}, headers=server.auth())
    assert bad_step.status_code == 400 and "error" in bad_step.json()


async def test_the_dashboard_download_relays_the_raw_log_as_the_session(server: InProcessServer) -> None:
    run_id, job_id = await _failed_run(server)
    page = f"/ui/runs/{run_id}/jobs/{job_id}/log"
    async with signed_in(server, server.owner_token) as browser:
        answer = await browser.get(page)
        assert answer.status_code == 200
        assert answer.headers["content-type"] == "text/plain; charset=utf-8"
        assert answer.headers["content-disposition"].startswith("attachment; filename=")
        assert "<script>alert(1)</script>" in answer.text and "lint ok" in answer.text
        assert answer.headers["x-content-type-options"] == "nosniff"
    assert server.state.read_log is not None
    await server.state.read_log.flush()  # reads are logged in batches
    async with server.state.db.read() as conn:
        sources = (
            (await conn.execute(select(access_log.c.source).where(access_log.c.action == "logs.raw")))
            .scalars()
            .all()
        )
    assert "dashboard" in sources
    other = await server.mint("owner", routing_key="local:other")
    async with signed_in(server, other) as browser:
        refused = await browser.get(page)
        assert refused.status_code == 404 and "text/html" in refused.headers["content-type"]
        assert "lint ok" not in refused.text
    anonymous = await server.client.get(page)
    assert anonymous.status_code == 303 and anonymous.headers["location"].startswith("/ui/sign-in")
