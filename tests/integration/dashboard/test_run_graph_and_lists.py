"""The run page's graph, trace and actions, and the lists' columns and filters (issue 42), on both dialects."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from sqlalchemy import insert, update

from conveyor.db.tables import DEFAULT_ORG, agents, events, runs
from conveyor.model.ids import new_id, utc_now
from tests.integration.dashboard.conftest import csrf_of, insert_run, signed_in
from tests.support.inprocess import InProcessServer

DIAMOND = [
    {"name": "a", "status": "success", "steps": [("make", "success")]},
    {"name": "b", "status": "success", "needs": ["a"], "steps": [("make", "success")]},
    {"name": "c", "status": "failed", "needs": ["a"], "steps": [("make", "failed")]},
    {"name": "d", "status": "cancelled", "needs": ["b", "c"], "steps": []},
]


@pytest.fixture
def server_env() -> dict[str, str]:
    """Settings of the real app; ephemeral agents offline for more than a minute are hidden."""
    return {"CONVEYOR_DASHBOARD_AGENT_GONE_MS": "60000"}


async def test_the_run_page_draws_the_jobs_as_a_graph_with_live_statuses(server: InProcessServer) -> None:
    run_id = await insert_run(server.state.db, status="failed", jobs_spec=DIAMOND)
    async with signed_in(server, server.owner_token) as browser:
        html = (await browser.get(f"/ui/runs/{run_id}")).text
    graph = html[html.index('<svg class="graph"') : html.index("</svg>")]
    assert graph.count('class="gnode"') == 4
    assert graph.count('class="gedge"') == 4
    # Each box carries the job's status under the same key the live poll updates.
    jobs = re.findall(r'data-status-of="(job:[^"]+)">(\w+)</text>', graph)
    assert sorted(status for _, status in jobs) == ["cancelled", "failed", "success", "success"]
    for key, _ in jobs:
        assert html.count(f'data-status-of="{key}"') == 2  # the box and the job card's badge
    # A box links to its job card.
    for job_id in re.findall(r'data-node-of="([^"]+)"', graph):
        assert f'id="job-{job_id}"' in html


async def test_why_did_this_run_reads_as_lines_with_the_json_behind_a_toggle(server: InProcessServer) -> None:
    run_id = await insert_run(server.state.db, jobs_spec=DIAMOND[:1])
    trace = {
        "event": {"type": "push", "branch": "main", "sha": "f" * 40, "changed_files": ["x.py"]},
        "workflow": {
            "workflow": "ci",
            "matched": True,
            "matched_trigger": 0,
            "triggers": [
                {
                    "index": 0,
                    "type": "push",
                    "matched": True,
                    "checks": [{"filter": "branches", "ok": True, "detail": "main matches main"}],
                }
            ],
        },
    }
    async with server.state.db.transaction() as conn:
        await conn.execute(update(runs).where(runs.c.id == run_id).values(trigger_trace=trace))
    async with signed_in(server, server.owner_token) as browser:
        html = (await browser.get(f"/ui/runs/{run_id}")).text
    lines = html[html.index('id="trace-lines">') : html.index("</pre>", html.index('id="trace-lines">'))]
    assert "event push on main at ffffffffffff changed files: 1" in lines
    assert "MATCHED  ci  (trigger 0)" in lines
    assert "ok  branches: main matches main" in lines
    raw = html[html.index('<details class="raw-trace">') :]
    assert "<summary>Raw decision (JSON)</summary>" in raw and "&#34;matched_trigger&#34;: 0" in raw


async def test_rerun_failed_jobs_is_offered_on_a_failed_run_only(server: InProcessServer) -> None:
    failed = await insert_run(server.state.db, status="failed", jobs_spec=DIAMOND)
    succeeded = await insert_run(server.state.db, status="success", jobs_spec=DIAMOND[:1])
    cancelled = await insert_run(server.state.db, status="cancelled", jobs_spec=DIAMOND[:1])
    async with signed_in(server, server.owner_token) as browser:
        assert "Re-run failed jobs" in (await browser.get(f"/ui/runs/{failed}")).text
        for run_id in (succeeded, cancelled):
            html = (await browser.get(f"/ui/runs/{run_id}")).text
            assert "Re-run failed jobs" not in html and ">Re-run</button>" in html


async def test_the_runs_list_shows_source_duration_and_why_a_run_failed(server: InProcessServer) -> None:
    jobs_spec = [{"name": "test", "status": "failed", "steps": [("pytest", "failed")]}]
    failed = await insert_run(server.state.db, status="failed", jobs_spec=jobs_spec)
    ok = await insert_run(server.state.db, status="success")
    started = utc_now() - timedelta(minutes=3, seconds=4)
    async with server.state.db.transaction() as conn:
        await conn.execute(
            update(runs).where(runs.c.id == failed).values(started_at=started, finished_at=utc_now())
        )
        await conn.execute(update(runs).where(runs.c.id == ok).values(routing_key="git:other"))
    async with signed_in(server, server.owner_token) as browser:
        html = (await browser.get("/ui/runs")).text
    header = html[html.index("<thead>") : html.index("</thead>")]
    assert "<th>Source</th>" in header and "<th>Duration</th>" in header and "<th>Failure</th>" in header
    failed_row = html[html.index(f'data-run-id="{failed}"') :].split("</tr>")[0]
    assert '<td class="source">local:app</td>' in failed_row
    assert re.search(r'class="duration"[^>]*>3 min [45] s<', failed_row)
    assert "test: failed" in failed_row  # the job that ended it, as `run list` says
    ok_row = html[html.index(f'data-run-id="{ok}"') :].split("</tr>")[0]
    assert '<td class="source">git:other</td>' in ok_row
    assert re.search(r'class="failure"[^>]*></td>', ok_row)
    # Times read relative, with the exact time on hover (how relative depends on how long the test took
    # to get here; the wording itself is the unit tests' of `relative_time`).
    assert re.search(
        r'<time datetime="[^"]+" title="\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} UTC">'
        r"(just now|\d+ s ago|\d+ min ago)</time>",
        failed_row,
    )


async def _event(server: InProcessServer, name: str) -> str:
    event_id = new_id()
    async with server.state.db.transaction() as conn:
        await conn.execute(
            insert(events).values(
                id=event_id, name=name, origin="admin", org_id=DEFAULT_ORG, payload={}, created_at=utc_now()
            )
        )
    return event_id


async def test_the_events_list_hides_conveyors_own_names_unless_asked(server: InProcessServer) -> None:
    mine = await _event(server, "deploy.done")
    completion = await _event(server, "__workflow_complete")
    notification = await _event(server, "conveyor.notification")
    lookalike = await _event(server, "my__event")
    async with signed_in(server, server.owner_token) as browser:
        default = (await browser.get("/ui/events")).text
        assert mine in default and lookalike in default
        assert completion not in default and notification not in default
        assert 'href="/ui/events?internal=1"' in default
        asked = (await browser.get("/ui/events", params={"internal": "1"})).text
        assert all(e in asked for e in (mine, completion, notification, lookalike))
        by_name = (await browser.get("/ui/events", params={"name": "__workflow_complete"})).text
        assert completion in by_name and mine not in by_name
    api = await server.client.get("/api/v1/admin/events", params={"internal": "false"}, headers=server.auth())
    assert sorted(e["id"] for e in api.json()["items"]) == sorted([mine, lookalike])
    everything = await server.client.get("/api/v1/admin/events", headers=server.auth())
    assert len(everything.json()["items"]) == 4


async def _agent(server: InProcessServer, agent_id: str, *, ephemeral: bool, state: str, gone_s: int) -> None:
    at = utc_now() - timedelta(seconds=gone_s)
    async with server.state.db.transaction() as conn:
        await conn.execute(
            insert(agents).values(
                agent_id=agent_id,
                org_id=DEFAULT_ORG,
                labels=["linux"],
                mandatory_labels=[],
                capacity=1,
                ephemeral=ephemeral,
                state=state,
                first_seen_at=at,
                connected_at=at,
                last_seen_at=at,
                disconnected_at=at if state == "offline" else None,
            )
        )


async def test_the_agents_list_hides_ephemeral_agents_long_gone_unless_asked(server: InProcessServer) -> None:
    await _agent(server, "eph-gone", ephemeral=True, state="offline", gone_s=3600)
    await _agent(server, "eph-recent", ephemeral=True, state="offline", gone_s=5)
    await _agent(server, "static-gone", ephemeral=False, state="offline", gone_s=3600)
    await _agent(server, "eph-online", ephemeral=True, state="online", gone_s=3600)
    async with signed_in(server, server.owner_token) as browser:
        default = (await browser.get("/ui/agents")).text
        assert "eph-gone" not in default
        assert all(a in default for a in ("eph-recent", "static-gone", "eph-online"))
        assert "1 ephemeral agent(s) offline for more than 1 min hidden" in default
        everything = (await browser.get("/ui/agents", params={"gone": "1"})).text
        assert all(a in everything for a in ("eph-gone", "eph-recent", "static-gone", "eph-online"))


async def test_an_unknown_dashboard_page_is_an_html_404(server: InProcessServer) -> None:
    async with signed_in(server, server.owner_token) as browser:
        for path in ("/ui/nope", "/ui/runs/x/nothing/here", "/ui/static-ish"):
            answer = await browser.get(path)
            assert answer.status_code == 404, path
            assert answer.headers["content-type"].startswith("text/html")
            assert "there is no dashboard page" in answer.text and "<nav>" in answer.text
        assert (await browser.get("/ui/static/app.js")).status_code == 200
        assert (await browser.get("/ui/static/missing.js")).status_code == 404
    signed_out = await server.client.get("/ui/nope")
    assert signed_out.status_code == 404 and signed_out.headers["content-type"].startswith("text/html")


async def test_notices_say_what_happened(server: InProcessServer) -> None:
    run_id = await insert_run(
        server.state.db, status="running", jobs_spec=[{"name": "build", "status": "queued"}]
    )
    number = (await server.client.get(f"/api/v1/admin/runs/{run_id}", headers=server.auth())).json()["number"]
    async with signed_in(server, server.owner_token) as browser:
        cancelled = await browser.post(
            f"/ui/runs/{run_id}/cancel", data={"csrf_token": await csrf_of(browser)}
        )
        assert cancelled.status_code == 303
        page = await browser.get(cancelled.headers["location"])
        assert re.search(rf'<p class="notice">run #{number} cancelled[ (<]', page.text), page.text[:2000]
