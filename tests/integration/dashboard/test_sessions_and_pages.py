"""Dashboard sign-in, sessions, CSRF, permissions, headers and pages, against the real in-process app."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import func, insert, select, update

from conveyor.cluster.routes import PEER_HUB
from conveyor.dashboard.sessions import COOKIE_NAME
from conveyor.db.tables import access_log, dashboard_sessions, peer_credentials
from conveyor.model.ids import new_id, utc_now
from tests.integration.dashboard.conftest import csrf_of, insert_run, signed_in
from tests.support.inprocess import InProcessServer


async def _session_count(server: InProcessServer) -> int:
    async with server.state.db.read() as conn:
        return int((await conn.execute(select(func.count()).select_from(dashboard_sessions))).scalar_one())


async def test_root_redirects_to_the_dashboard_and_pages_need_a_session(server: InProcessServer) -> None:
    root = await server.client.get("/")
    assert root.status_code == 307 and root.headers["location"] == "/ui/"
    for page in (
        "/ui/runs",
        "/ui/runs/x",
        "/ui/deliveries",
        "/ui/events",
        "/ui/dlq",
        "/ui/agents",
        "/ui/cluster",
    ):
        answer = await server.client.get(page)
        assert answer.status_code == 303, page
        assert answer.headers["location"].startswith("/ui/sign-in?next="), page
    sign_in_page = await server.client.get("/ui/sign-in")
    assert sign_in_page.status_code == 200
    policy = sign_in_page.headers["content-security-policy"]
    assert "frame-ancestors 'none'" in policy and "script-src 'self'" in policy
    assert "unsafe-inline" not in policy
    assert sign_in_page.headers["x-frame-options"] == "DENY"
    static = await server.client.get("/ui/static/app.js")
    assert static.status_code == 200 and "EventSource" in static.text


async def test_sign_in_sets_a_strict_http_only_cookie_that_is_not_the_token(server: InProcessServer) -> None:
    answer = await server.client.post("/ui/sign-in", data={"token": server.owner_token, "next": "/ui/events"})
    assert answer.status_code == 303 and answer.headers["location"] == "/ui/events"
    cookie = answer.headers["set-cookie"]
    assert cookie.startswith(f"{COOKIE_NAME}=")
    lowered = cookie.lower()
    assert "httponly" in lowered and "samesite=strict" in lowered and "secure" not in lowered
    assert server.owner_token not in cookie
    assert server.owner_token.removeprefix("cvy_admin_") not in cookie
    assert await _session_count(server) == 1


async def test_sign_in_redirects_only_inside_the_dashboard(server: InProcessServer) -> None:
    for target in ("https://evil.example/", "//evil.example/ui", "/api/v1/admin/tokens"):
        answer = await server.client.post("/ui/sign-in", data={"token": server.owner_token, "next": target})
        assert answer.headers["location"] == "/ui/runs", target


async def test_a_sign_in_posted_from_another_site_is_refused_and_signs_nobody_in(
    server: InProcessServer,
) -> None:
    for origin in ("https://evil.example", "null", "http://testserver:8080"):
        answer = await server.client.post(
            "/ui/sign-in", data={"token": server.owner_token}, headers={"Origin": origin}
        )
        assert answer.status_code == 403, origin
        assert "set-cookie" not in answer.headers, origin
    assert await _session_count(server) == 0
    ours = await server.client.post(
        "/ui/sign-in", data={"token": server.owner_token}, headers={"Origin": "http://testserver"}
    )
    assert ours.status_code == 303 and await _session_count(server) == 1


async def test_failed_sign_ins_are_refused_counted_and_throttled(server: InProcessServer) -> None:
    metric = server.state.metrics.admin_auth_failures
    before = metric.labels("invalid")._value.get()
    for bad in ("nonsense", "cvy_admin_" + "0" * 64, "cvy_admin_" + "1" * 64):
        answer = await server.client.post("/ui/sign-in", data={"token": bad})
        assert answer.status_code == 401
        assert "set-cookie" not in answer.headers
        assert bad not in answer.text
    assert metric.labels("invalid")._value.get() == before + 3
    throttled = await server.client.post("/ui/sign-in", data={"token": server.owner_token})
    assert throttled.status_code == 429 and int(throttled.headers["retry-after"]) >= 1
    assert "set-cookie" not in throttled.headers
    assert await _session_count(server) == 0


async def test_every_page_renders_for_the_owner_without_the_token_in_it(server: InProcessServer) -> None:
    run_id = await insert_run(
        server.state.db,
        status="failed",
        jobs_spec=[
            {
                "name": "test",
                "status": "failed",
                "needs": ["build"],
                "steps": [("setup", "success"), ("pytest", "failed")],
            },
            {"name": "build", "status": "success", "steps": [("setup", "success"), ("make", "success")]},
        ],
    )
    async with signed_in(server, server.owner_token) as browser:
        for page in ("/ui/runs", "/ui/deliveries", "/ui/events", "/ui/dlq", "/ui/agents", "/ui/cluster"):
            answer = await browser.get(page)
            assert answer.status_code == 200, (page, answer.text[:500])
            assert server.owner_token not in answer.text
            assert "cache-control" in answer.headers and answer.headers["cache-control"] == "no-store"
        detail = await browser.get(f"/ui/runs/{run_id}")
        assert detail.status_code == 200
        html = detail.text
        # jobs in `needs` order: build before test, although test was created first
        assert html.index("data-job-id") < html.index(">build ") < html.index(">test ")
        # the failed job opens at its failing step
        assert 'data-step="' in html and " open>" in html.split("pytest")[0].rsplit("<details", 1)[1]
        missing = await browser.get("/ui/runs/does-not-exist")
        assert missing.status_code == 404 and "run does-not-exist" in missing.text


async def test_runs_filter_by_ref_and_status_in_the_api_and_the_page(server: InProcessServer) -> None:
    main_run = await insert_run(server.state.db, ref="refs/heads/main")
    other_run = await insert_run(server.state.db, ref="refs/heads/feature", status="failed")
    tag_run = await insert_run(server.state.db, ref="refs/tags/v1")
    api = server.client
    by_branch = (await api.get("/api/v1/admin/runs", params={"ref": "main"}, headers=server.auth())).json()
    assert [r["id"] for r in by_branch["items"]] == [main_run]
    full = (await api.get("/api/v1/admin/runs", params={"ref": "refs/tags/v1"}, headers=server.auth())).json()
    assert [r["id"] for r in full["items"]] == [tag_run]
    async with signed_in(server, server.owner_token) as browser:
        page = (await browser.get("/ui/runs", params={"ref": "feature", "status": "failed"})).text
        assert other_run in page and main_run not in page and tag_run not in page


async def test_a_write_without_the_csrf_value_is_refused_and_changes_nothing(server: InProcessServer) -> None:
    run_id = await insert_run(
        server.state.db, status="running", jobs_spec=[{"name": "build", "status": "running"}]
    )
    async with signed_in(server, server.owner_token) as browser:
        refused = await browser.post(f"/ui/runs/{run_id}/cancel", data={})
        assert refused.status_code == 403
        forged = await browser.post(f"/ui/runs/{run_id}/cancel", data={"csrf_token": "0" * 64})
        assert forged.status_code == 403
        cross_site = await browser.post(
            f"/ui/runs/{run_id}/cancel",
            data={"csrf_token": await csrf_of(browser)},
            headers={"Origin": "https://evil.example"},
        )
        assert cross_site.status_code == 403
        run = (await server.client.get(f"/api/v1/admin/runs/{run_id}", headers=server.auth())).json()
        assert run["status"] == "running" and run.get("cancel_requested_at") is None
        accepted = await browser.post(
            f"/ui/runs/{run_id}/cancel", data={"csrf_token": await csrf_of(browser)}
        )
        assert accepted.status_code == 303
        run = (await server.client.get(f"/api/v1/admin/runs/{run_id}", headers=server.auth())).json()
        assert run["cancel_requested_at"] is not None or run["status"] == "cancelled"


async def test_dashboard_writes_are_access_logged_with_source_dashboard(server: InProcessServer) -> None:
    async with signed_in(server, server.owner_token) as browser:
        answer = await browser.post(
            "/ui/dlq/no-such-event/discard", data={"csrf_token": await csrf_of(browser)}
        )
        assert answer.status_code == 404
    async with server.state.db.read() as conn:
        rows = (
            await conn.execute(select(access_log).where(access_log.c.action == "event_dlq.discard"))
        ).all()
    assert [(r.source, r.actor_role, r.status_code) for r in rows] == [("dashboard", "owner", 404)]


async def test_an_auditor_sees_the_dlq_without_working_actions_or_payloads(server: InProcessServer) -> None:
    emitted = await server.client.post(
        "/api/v1/admin/events",
        json={"name": "deploy.requested", "payload": {"customer": "marker-7731"}},
        headers=server.auth(),
    )
    assert emitted.status_code == 201, emitted.text
    event_id = emitted.json()["event_id"]
    async with signed_in(server, await server.mint("auditor")) as auditor:
        dlq = await auditor.get("/ui/dlq")
        assert dlq.status_code == 200
        csrf = await csrf_of(auditor, "/ui/dlq")
        forced = await auditor.post(f"/ui/dlq/{event_id}/retry", data={"csrf_token": csrf})
        assert forced.status_code == 403 and "event_dlq.manage" in forced.text
        event_page = await auditor.get(f"/ui/events/{event_id}")
        assert event_page.status_code == 200 and "/payload" not in event_page.text
        payload = await auditor.get(f"/ui/events/{event_id}/payload")
        assert payload.status_code == 403 and "marker-7731" not in payload.text
    async with signed_in(server, server.owner_token) as owner:
        event_page = await owner.get(f"/ui/events/{event_id}")
        assert f"/ui/events/{event_id}/payload" in event_page.text
        assert (await owner.get(f"/ui/events/{event_id}/payload")).status_code == 200


async def test_a_revoked_token_signs_its_session_out_on_the_next_request(server: InProcessServer) -> None:
    operator = await server.mint("operator")
    async with signed_in(server, operator) as browser:
        assert (await browser.get("/ui/runs")).status_code == 200
        tokens = (await server.client.get("/api/v1/admin/tokens", headers=server.auth())).json()["items"]
        token_id = next(t["id"] for t in tokens if t["role"] == "operator")
        revoked = await server.client.delete(f"/api/v1/admin/tokens/{token_id}", headers=server.auth())
        assert revoked.status_code == 204
        after = await browser.get("/ui/runs")
        assert after.status_code == 303 and after.headers["location"].startswith("/ui/sign-in")
        assert (await browser.get("/api/v1/admin/runs")).status_code == 401
    assert await _session_count(server) == 0


async def test_an_idle_session_expires_and_sign_out_ends_it(server: InProcessServer) -> None:
    async with signed_in(server, server.owner_token) as browser:
        assert (await browser.get("/ui/runs")).status_code == 200
        async with server.state.db.transaction() as conn:
            long_ago = utc_now().replace(year=utc_now().year - 1)
            await conn.execute(update(dashboard_sessions).values(last_seen_at=long_ago))
        assert (await browser.get("/ui/runs")).status_code == 303
    async with signed_in(server, server.owner_token) as browser:
        stolen = browser.cookies[COOKIE_NAME]
        out = await browser.post("/ui/sign-out", data={"csrf_token": await csrf_of(browser)})
        assert out.status_code == 303
    assert await _session_count(server) == 0
    replay = await server.client.get("/ui/runs", headers={"Cookie": f"{COOKIE_NAME}={stolen}"})
    assert replay.status_code == 303


async def test_the_session_cookie_reads_the_admin_api_but_never_writes(server: InProcessServer) -> None:
    run_id = await insert_run(
        server.state.db, status="running", jobs_spec=[{"name": "build", "status": "running"}]
    )
    async with signed_in(server, server.owner_token) as browser:
        read = await browser.get(f"/api/v1/admin/runs/{run_id}")
        assert read.status_code == 200 and read.json()["id"] == run_id
        write = await browser.post(f"/api/v1/admin/runs/{run_id}/cancel", json={})
        assert write.status_code == 401
        forged = await server.client.get(
            "/api/v1/admin/runs", headers={"Cookie": f"{COOKIE_NAME}={browser.cookies[COOKIE_NAME][:-3]}AAA"}
        )
        assert forged.status_code == 401
    async with server.state.db.read() as conn:
        sources = (
            await conn.execute(select(access_log.c.source).where(access_log.c.action == "runs.cancel"))
        ).all()
    assert sources == [("http",)]


async def test_log_text_and_payloads_are_escaped(server: InProcessServer) -> None:
    run_id = await insert_run(
        server.state.db,
        workflow="<script>alert(1)</script>",
        jobs_spec=[{"name": "<b>x</b>", "steps": [("s", "success")]}],
    )
    async with signed_in(server, server.owner_token) as browser:
        for page in ("/ui/runs", f"/ui/runs/{run_id}"):
            html = (await browser.get(page)).text
            assert "<script>alert(1)</script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
            assert "<b>x</b>" not in html


async def test_the_cluster_page_lists_peers_with_their_credentials(server: InProcessServer) -> None:
    now = utc_now()
    async with server.state.db.transaction() as conn:
        await conn.execute(
            insert(peer_credentials).values(
                id=new_id(),
                instance_id="worker-7",
                role="worker",
                stored_key=b"s" * 32,
                server_key=b"k" * 32,
                created_at=now,
                expires_at=now + timedelta(days=90),
                revoked_at=now,
            )
        )
    # `GET peers` lists the registry's peers (a credential alone is not a known peer,
    # docs/design/cluster.md §7.1).
    hub = server.state.parts.get(PEER_HUB)
    assert hub is not None
    hub.registry.seed("worker-7", "worker")
    async with signed_in(server, server.owner_token) as browser:
        page = await browser.get("/ui/cluster")
    assert page.status_code == 200
    peers = page.text.split("<h2>Peers</h2>", 1)[1].split("<h2>", 1)[0]
    assert "<code>worker-7</code></td><td>worker</td><td>no</td>" in peers
    assert "never" in peers, "a peer never heard from has no heartbeat"
