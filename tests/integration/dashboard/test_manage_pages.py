"""The dashboard's "Run workflow" form and management pages (issue 42), against the real in-process app:
inputs validated by the API, secrets whose values no page shows, RBAC and CSRF on every action."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from conveyor.db.tables import access_log
from conveyor.secrets import SECRETS, SecretService
from tests.integration.dashboard.conftest import csrf_of, signed_in
from tests.support.inprocess import InProcessServer
from tests.support.repos import make_repo

SECRET_VALUE = "hunter2-marker-5521"


@pytest.fixture
async def source_id(server: InProcessServer, tmp_path: Path) -> str:
    """A `local` source `app` whose `ci` has a dispatch trigger with inputs `target` (str, required) and
    `level` (int, default 3)."""
    repo = make_repo(tmp_path / "repo")
    added = await server.client.post(
        "/api/v1/admin/sources",
        json={"kind": "local", "name": "app", "path": str(repo)},
        headers=server.auth(),
    )
    assert added.status_code == 201, added.text
    return str(added.json()["id"])


async def _runs(server: InProcessServer) -> list[dict[str, Any]]:
    answer = await server.client.get("/api/v1/admin/runs", headers=server.auth())
    assert answer.status_code == 200, answer.text
    return list(answer.json()["items"])


async def _secret_names(server: InProcessServer) -> list[str]:
    answer = await server.client.get("/api/v1/admin/secrets", headers=server.auth())
    assert answer.status_code == 200, answer.text
    return [f"{s['scope']}/{s['name']}" for s in answer.json()["items"]]


async def test_the_workflows_route_reads_the_lock_at_the_ref_with_each_dispatch_triggers_inputs(
    server: InProcessServer, source_id: str
) -> None:
    answer = await server.client.get(f"/api/v1/admin/sources/{source_id}/workflows", headers=server.auth())
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert (body["name"], body["routing_key"], body["ref"], len(body["sha"])) == (
        "app",
        "local:app",
        "main",
        40,
    )
    (ci,) = body["workflows"]
    assert ci["name"] == "ci"
    assert ci["dispatch"]["inputs"]["target"]["required"] is True
    assert ci["dispatch"]["inputs"]["level"] == {
        "type": "integer",
        "required": False,
        "default": 3,
        "choices": None,
        "min": None,
        "max": None,
        "pattern": None,
        "description": None,
    }
    unknown = await server.client.get(
        f"/api/v1/admin/sources/{source_id}/workflows", params={"ref": "nope"}, headers=server.auth()
    )
    assert unknown.status_code == 400 and unknown.json()["error"] == "unknown_ref"
    other = await server.mint("auditor", routing_key="local:other")
    hidden = await server.client.get(
        f"/api/v1/admin/sources/{source_id}/workflows", headers=server.auth(other)
    )
    assert hidden.status_code == 404


async def test_run_workflow_shows_the_declared_inputs_and_starts_a_run_with_them(
    server: InProcessServer, source_id: str
) -> None:
    async with signed_in(server, server.owner_token) as browser:
        sources = await browser.get("/ui/sources")
        assert sources.status_code == 200 and f'href="/ui/sources/{source_id}"' in sources.text
        source = await browser.get(f"/ui/sources/{source_id}")
        assert source.status_code == 200
        assert f'href="/ui/sources/{source_id}/workflows/ci"' in source.text and "(2 input(s))" in source.text
        page = await browser.get(f"/ui/sources/{source_id}/workflows/ci")
        assert page.status_code == 200
        assert 'id="run-workflow"' in page.text
        assert 'name="input.target" value=""' in page.text and 'name="input.level" value="3"' in page.text
        started = await browser.post(
            f"/ui/sources/{source_id}/workflows/ci/run",
            data={
                "csrf_token": await csrf_of(browser),
                "ref": "main",
                "input.target": "prod",
                "input.level": "5",
            },
        )
        assert started.status_code == 303, started.text
        (run,) = await _runs(server)
        assert started.headers["location"].startswith(f"/ui/runs/{run['id']}?notice=")
        shown = await browser.get(started.headers["location"])
        assert f"run #{run['number']} started: ci by hand" in shown.text
    detail = (await server.client.get(f"/api/v1/admin/runs/{run['id']}", headers=server.auth())).json()
    assert detail["event"]["payload"]["inputs"] == {"target": "prod", "level": 5}
    async with server.state.db.read() as conn:
        rows = (await conn.execute(select(access_log).where(access_log.c.action == "runs.start"))).all()
    assert [(r.source, r.status_code) for r in rows] == [("dashboard", 201)]


async def test_a_bad_input_shows_the_apis_error_keeps_what_was_typed_and_starts_nothing(
    server: InProcessServer, source_id: str
) -> None:
    async with signed_in(server, server.owner_token) as browser:
        refused = await browser.post(
            f"/ui/sources/{source_id}/workflows/ci/run",
            data={
                "csrf_token": await csrf_of(browser),
                "ref": "main",
                "input.level": "abc",
                "input.nope": "1",
            },
        )
        assert refused.status_code == 400
        error = html.unescape(refused.text.split('id="run-refused">', 1)[1].split("</p>", 1)[0])
        assert "target: is required" in error and "level: cannot parse 'abc'" in error
        assert "nope: unknown input" in error
        assert 'name="input.level" value="abc"' in refused.text
        bad_ref = await browser.post(
            f"/ui/sources/{source_id}/workflows/ci/run",
            data={"csrf_token": await csrf_of(browser), "ref": "no-such-branch", "input.target": "x"},
        )
        assert bad_ref.status_code == 400 and "no-such-branch is not a branch" in bad_ref.text
    assert await _runs(server) == []


async def test_a_secret_set_from_the_page_is_listed_by_name_and_its_value_is_never_rendered(
    server: InProcessServer, source_id: str
) -> None:
    async with signed_in(server, server.owner_token) as browser:
        created = await browser.post(
            "/ui/secrets/set",
            data={
                "csrf_token": await csrf_of(browser),
                "scope": "org",
                "name": "DEPLOY_TOKEN",
                "value": SECRET_VALUE,
            },
        )
        assert created.status_code == 303 and SECRET_VALUE not in created.headers["location"]
        listed = await browser.get(created.headers["location"])
        assert "secret DEPLOY_TOKEN created in scope org" in listed.text
        assert 'data-secret="org/DEPLOY_TOKEN"' in listed.text
        replaced = await browser.post(
            "/ui/secrets/set",
            data={
                "csrf_token": await csrf_of(browser),
                "scope": "org",
                "name": "DEPLOY_TOKEN",
                "value": SECRET_VALUE + "2",
            },
        )
        assert "replaced" in replaced.headers["location"]
        bad = await browser.post(
            "/ui/secrets/set",
            data={
                "csrf_token": await csrf_of(browser),
                "scope": "org",
                "name": "9bad",
                "value": SECRET_VALUE,
            },
        )
        assert bad.status_code == 400 and SECRET_VALUE not in bad.text
        for page in (
            "/ui/secrets",
            "/ui/runs",
            "/ui/sources",
            f"/ui/sources/{source_id}",
            f"/ui/sources/{source_id}/workflows/ci",
            "/ui/events?internal=1",
            "/ui/agents",
        ):
            answer = await browser.get(page)
            assert answer.status_code == 200, page
            assert SECRET_VALUE not in answer.text, page
        deleted = await browser.post(
            "/ui/secrets/delete",
            data={"csrf_token": await csrf_of(browser), "scope": "org", "name": "DEPLOY_TOKEN"},
        )
        assert deleted.status_code == 303 and "deleted" in deleted.headers["location"]
    assert "org/DEPLOY_TOKEN" not in await _secret_names(server)
    async with server.state.db.read() as conn:
        rows = (
            await conn.execute(
                select(access_log.c.action, access_log.c.source).where(access_log.c.target_type == "secret")
            )
        ).all()
    assert sorted(set(rows)) == [("secrets.delete", "dashboard"), ("secrets.set", "dashboard")]


async def test_management_posts_without_the_csrf_value_or_from_another_site_change_nothing(
    server: InProcessServer, source_id: str
) -> None:
    async with signed_in(server, server.owner_token) as browser:
        csrf = await csrf_of(browser)
        no_csrf = await browser.post("/ui/secrets/set", data={"name": "A", "value": "v"})
        assert no_csrf.status_code == 403
        cross_site = await browser.post(
            f"/ui/sources/{source_id}/workflows/ci/run",
            data={"csrf_token": csrf, "input.target": "prod"},
            headers={"Origin": "https://evil.example"},
        )
        assert cross_site.status_code == 403
        forged = await browser.post("/ui/scalers/reload", data={"csrf_token": "0" * 64})
        assert forged.status_code == 403
    assert await _secret_names(server) == [] and await _runs(server) == []


async def test_an_auditor_sees_no_management_forms_and_a_forced_post_is_refused_403_changing_nothing(
    server: InProcessServer, source_id: str
) -> None:
    kept = await server.client.put(
        "/api/v1/admin/secrets/org/KEPT", json={"value": SECRET_VALUE}, headers=server.auth()
    )
    assert kept.status_code == 201, kept.text
    async with signed_in(server, await server.mint("auditor")) as auditor:
        workflow = await auditor.get(f"/ui/sources/{source_id}/workflows/ci")
        assert workflow.status_code == 200
        assert 'id="run-workflow"' not in workflow.text and 'id="run-not-allowed"' in workflow.text
        secrets = await auditor.get("/ui/secrets")
        assert secrets.status_code == 200 and 'data-secret="org/KEPT"' in secrets.text
        agents = await auditor.get("/ui/agents")
        tokens = await auditor.get("/ui/tokens")
        assert 'id="admin-tokens-not-allowed"' in tokens.text
        notifications = await auditor.get("/ui/notifications")
        source = await auditor.get(f"/ui/sources/{source_id}")
        environments = await auditor.get("/ui/environments")
        for page in (workflow, secrets, agents, tokens, notifications, source, environments):
            assert page.status_code == 200, page.url
            # No action form at all: the only POST form on an auditor's page is "Sign out".
            assert page.text.count('method="post"') == 1, page.url
        csrf = await csrf_of(auditor, "/ui/secrets")
        forced = {
            f"/ui/sources/{source_id}/workflows/ci/run": ({"input.target": "prod"}, "source.trigger"),
            "/ui/secrets/set": ({"scope": "org", "name": "KEPT", "value": "overwritten"}, "secret.write"),
            "/ui/secrets/delete": ({"scope": "org", "name": "KEPT"}, "secret.write"),
            "/ui/scalers/reload": ({}, "scaler.manage"),
            "/ui/tokens/create": ({"role": "owner"}, "token.manage"),
            "/ui/agent-tokens/create": ({"labels": "linux"}, "agent.manage"),
            "/ui/notifications/create": ({"on": "failed", "target": "a@example.com"}, "source.manage"),
            f"/ui/sources/{source_id}/switch": (
                {"setting": "public_badges", "value": "true"},
                "source.manage",
            ),
            f"/ui/sources/{source_id}/remove": ({}, "source.manage"),
            "/ui/variables/set": ({"name": "REGION", "value": "eu"}, "secret.write"),
            "/ui/sources/add": (
                {"kind": "generic", "name": "hooks", "webhook_secret": "x" * 16},
                "source.manage",
            ),
            "/ui/environments/set": ({"name": "production"}, "secret.write"),
        }
        for path, (data, permission) in forced.items():
            answer = await auditor.post(path, data={"csrf_token": csrf, **data})
            assert answer.status_code == 403, path
            assert permission in answer.text, path
    assert await _runs(server) == []
    assert await _secret_names(server) == ["org/KEPT"]
    service = server.state.parts.need(SECRETS)
    assert isinstance(service, SecretService)
    async with server.state.db.read() as conn:
        assert await service.reveal(conn, "org", "KEPT") == SECRET_VALUE
    async with server.state.db.read() as conn:
        denied = (
            await conn.execute(
                select(access_log.c.action).where(
                    access_log.c.outcome == "denied", access_log.c.source == "dashboard"
                )
            )
        ).all()
    assert {row.action for row in denied} >= {
        "runs.start",
        "secrets.set",
        "secrets.delete",
        "scaler.reload",
        "tokens.create",
        "agent_tokens.create",
        "notification_rules.create",
        "sources.update",
        "sources.delete",
    }
    shown = (await server.client.get(f"/api/v1/admin/sources/{source_id}", headers=server.auth())).json()
    assert shown["public_badges"] is False
    tokens = (await server.client.get("/api/v1/admin/tokens", headers=server.auth())).json()["items"]
    assert sorted(t["role"] for t in tokens) == ["auditor", "owner"]
    rules = (await server.client.get("/api/v1/admin/notification-rules", headers=server.auth())).json()
    assert rules["items"] == []


async def test_tokens_created_from_the_page_are_shown_once_and_work_until_revoked(
    server: InProcessServer,
) -> None:
    async with signed_in(server, server.owner_token) as browser:
        created = await browser.post(
            "/ui/tokens/create",
            data={
                "csrf_token": await csrf_of(browser),
                "label": "ci-reader",
                "role": "auditor",
                "routing_key": "",
            },
        )
        assert created.status_code == 201, created.text
        token = created.text.split('id="created-token">', 1)[1].split("<", 1)[0]
        assert token.startswith("cvy_admin_")
        assert (await server.client.get("/api/v1/admin/runs", headers=server.auth(token))).status_code == 200
        listed = await browser.get("/ui/tokens")
        assert token not in listed.text and "ci-reader" in listed.text
        token_id = listed.text.split('data-token-id="', 2)[1].split('"', 1)[0]
        rows = (await server.client.get("/api/v1/admin/tokens", headers=server.auth())).json()["items"]
        assert token_id == next(t["id"] for t in rows if t["label"] == "ci-reader")
        revoked = await browser.post(
            f"/ui/tokens/{token_id}/revoke", data={"csrf_token": await csrf_of(browser)}
        )
        assert revoked.status_code == 303
        assert (await server.client.get("/api/v1/admin/runs", headers=server.auth(token))).status_code == 401
        bad = await browser.post(
            "/ui/tokens/create", data={"csrf_token": await csrf_of(browser), "role": "root"}
        )
        assert bad.status_code == 422 and "role" in bad.text
        agent = await browser.post(
            "/ui/agent-tokens/create",
            data={"csrf_token": await csrf_of(browser), "label": "builder", "labels": "linux, docker"},
        )
        assert agent.status_code == 201 and 'id="created-token">cvy_agent_' in agent.text
        listed = await browser.get("/ui/tokens")
        assert "linux, docker" in listed.text and "builder" in listed.text


async def test_notification_rules_are_added_and_removed_from_the_page(server: InProcessServer) -> None:
    async with signed_in(server, server.owner_token) as browser:
        added = await browser.post(
            "/ui/notifications/create",
            data={
                "csrf_token": await csrf_of(browser),
                "on": ["failed", "fixed"],
                "workflow": "ci",
                "target_kind": "webhook",
                "target": "https://hooks.example.com/services/T000/SECRETPATH",
            },
        )
        assert added.status_code == 303, added.text
        listed = await browser.get("/ui/notifications")
        assert "failed, fixed" in listed.text and "SECRETPATH" not in listed.text
        (rule,) = (await server.client.get("/api/v1/admin/notification-rules", headers=server.auth())).json()[
            "items"
        ]
        assert (rule["on"], rule["workflow"], rule["target_kind"]) == (["failed", "fixed"], "ci", "webhook")
        removed = await browser.post(
            f"/ui/notifications/{rule['id']}/remove", data={"csrf_token": await csrf_of(browser)}
        )
        assert removed.status_code == 303
    rules = (await server.client.get("/api/v1/admin/notification-rules", headers=server.auth())).json()
    assert rules["items"] == []


async def test_a_source_is_switched_and_removed_from_its_page(
    server: InProcessServer, source_id: str
) -> None:
    async with signed_in(server, server.owner_token) as browser:
        page = await browser.get(f"/ui/sources/{source_id}")
        assert 'id="source-actions"' in page.text and "Make badges public" in page.text
        switched = await browser.post(
            f"/ui/sources/{source_id}/switch",
            data={"csrf_token": await csrf_of(browser), "setting": "public_badges", "value": "true"},
        )
        assert switched.status_code == 303 and "public+badges+on" in switched.headers["location"]
        badge = await server.client.get("/badge/app/ci.svg")
        assert badge.status_code == 200 and "image/svg+xml" in badge.headers["content-type"]
        odd = await browser.post(
            f"/ui/sources/{source_id}/switch",
            data={"csrf_token": await csrf_of(browser), "setting": "repo", "value": "true"},
        )
        assert odd.status_code == 400
        removed = await browser.post(
            f"/ui/sources/{source_id}/remove", data={"csrf_token": await csrf_of(browser)}
        )
        assert removed.status_code == 303
    listed = (await server.client.get("/api/v1/admin/sources", headers=server.auth())).json()
    assert listed["items"] == []


async def test_environments_and_org_variables_are_set_and_deleted_from_their_page(
    server: InProcessServer,
) -> None:
    async with signed_in(server, server.owner_token) as browser:
        for path, data in (
            ("/ui/environments/set", {"name": "production", "allowed_branches": "main, release/*"}),
            ("/ui/variables/set", {"name": "REGION", "value": "eu-west"}),
        ):
            answer = await browser.post(path, data={"csrf_token": await csrf_of(browser), **data})
            assert answer.status_code == 303, (path, answer.text)
        page = await browser.get("/ui/environments")
        assert 'data-environment="production"' in page.text and "main, release/*" in page.text
        assert 'data-variable="REGION"' in page.text and "eu-west" in page.text
        bad = await browser.post(
            "/ui/environments/set", data={"csrf_token": await csrf_of(browser), "name": "Bad Name"}
        )
        assert bad.status_code in (400, 404, 422)
        for path in ("/ui/environments/delete", "/ui/variables/delete"):
            name = "production" if "environments" in path else "REGION"
            answer = await browser.post(path, data={"csrf_token": await csrf_of(browser), "name": name})
            assert answer.status_code == 303, (path, answer.text)
    environments = (await server.client.get("/api/v1/admin/environments", headers=server.auth())).json()
    variables = (await server.client.get("/api/v1/admin/variables", headers=server.auth())).json()
    assert environments["items"] == [] and variables["items"] == []


async def test_a_source_added_from_the_page_keeps_its_webhook_secret_out_of_every_page(
    server: InProcessServer,
) -> None:
    async with signed_in(server, server.owner_token) as browser:
        added = await browser.post(
            "/ui/sources/add",
            data={
                "csrf_token": await csrf_of(browser, "/ui/sources"),
                "kind": "generic",
                "name": "hooks",
                "path": "",
                "webhook_secret": SECRET_VALUE,
            },
        )
        assert added.status_code == 303, added.text
        assert SECRET_VALUE not in added.headers["location"]
        page = await browser.get(added.headers["location"])
        assert "source hooks added" in page.text and "/webhooks/" in page.text
        assert "a generic source has no repository to read a lock from" in page.text
        for path in ("/ui/sources", "/ui/secrets", added.headers["location"]):
            assert SECRET_VALUE not in (await browser.get(path)).text, path
        refused = await browser.post(
            "/ui/sources/add",
            data={"csrf_token": await csrf_of(browser, "/ui/sources"), "kind": "local", "name": "nowhere"},
        )
        assert refused.status_code == 422 and "path" in refused.text
    listed = (await server.client.get("/api/v1/admin/sources", headers=server.auth())).json()["items"]
    assert [s["name"] for s in listed] == ["hooks"]
    # A generic source has no lock to run a workflow from: the API says so instead of failing (it was a 500).
    started = await server.client.post(
        "/api/v1/admin/runs", json={"source": "hooks", "workflow": "ci"}, headers=server.auth()
    )
    assert started.status_code == 400 and started.json()["error"] == "no_repository"
