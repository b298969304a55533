"""Approve and reject through the admin API for every role and scope, protection rules, held-job retention
and the approval event (docs/design/approvals.md §1–§5), on SQLite and PostgreSQL.

Runs and jobs are written straight to the database in the status run creation gives them; the end-to-end
path with a push and a real agent is `tests/e2e/test_approvals.py`.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import insert, select, update

from conveyor.db.tables import (
    DEFAULT_ORG,
    access_log,
    admin_tokens,
    dispatch_queue,
    events,
    job_needs,
    jobs,
    run_timeline,
    runs,
)
from conveyor.execution.approvals import expire_held
from conveyor.model.ids import new_id, utc_now
from conveyor.model.tokens import hash_token
from tests.support.inprocess import InProcessServer, in_process_server

API = "/api/v1/admin"


@pytest.fixture
async def server(database_url: str, tmp_path: Path) -> Any:
    async with in_process_server(database_url, tmp_path / "home") as running:
        yield running


async def protect(server: InProcessServer, name: str = "production", **rule: Any) -> dict[str, Any]:
    created = await server.client.put(f"{API}/environments/{name}", json={}, headers=server.auth())
    assert created.status_code in (200, 201), created.text
    answer = await server.client.put(
        f"{API}/environments/{name}/protection", json={"approvers": ["admin"], **rule}, headers=server.auth()
    )
    assert answer.status_code == 200, answer.text
    return answer.json()  # type: ignore[no-any-return]


async def waiting_run(
    server: InProcessServer,
    *,
    routing_key: str = "local:app",
    triggered_by: str | None = None,
    age_days: int = 0,
) -> tuple[str, str, str]:
    """A run whose `deploy` waits for `production` and whose `announce` needs it: (run, deploy, announce)."""
    now = utc_now()
    since = now - timedelta(days=age_days)
    run_id, deploy, announce = new_id(), new_id(), new_id()
    async with server.state.db.transaction() as conn:
        await conn.execute(
            insert(runs).values(
                id=run_id,
                org_id=DEFAULT_ORG,
                number=1,
                workflow="ship",
                repo="acme/app",
                ref="refs/heads/main",
                sha="a" * 40,
                routing_key=routing_key,
                event={},
                status="queued",
                created_at=now,
                triggered_by=triggered_by,
            )
        )
        for job_id, name, status in (
            (deploy, "deploy", "waiting_approval"),
            (announce, "announce", "pending"),
        ):
            await conn.execute(
                insert(jobs).values(
                    id=job_id,
                    run_id=run_id,
                    org_id=DEFAULT_ORG,
                    name=name,
                    display_name=name,
                    status=status,
                    blocked_on="approval" if name == "deploy" else "needs",
                    blocked_since=since if name == "deploy" else None,
                    environment="production" if name == "deploy" else None,
                    runs_on={"labels": [{"kind": "exact", "pattern": "linux"}], "exclude": []},
                    created_at=now,
                )
            )
        await conn.execute(
            insert(job_needs).values(job_id=announce, upstream_name="deploy", run_on=["success"])
        )
    return run_id, deploy, announce


async def job_row(server: InProcessServer, job_id: str) -> dict[str, Any]:
    async with server.state.db.read() as conn:
        return dict((await conn.execute(select(jobs).where(jobs.c.id == job_id))).one()._mapping)


async def queued(server: InProcessServer, job_id: str) -> dict[str, Any] | None:
    async with server.state.db.read() as conn:
        row = (await conn.execute(select(dispatch_queue).where(dispatch_queue.c.job_id == job_id))).first()
    return dict(row._mapping) if row is not None else None


def decide_path(run_id: str, job_id: str, verb: str) -> str:
    return f"{API}/runs/{run_id}/jobs/{job_id}/{verb}"


@pytest.mark.parametrize("verb", ["approve", "reject"])
@pytest.mark.parametrize(
    ("role", "expected"), [("owner", 200), ("admin", 200), ("operator", 200), ("auditor", 403)]
)
async def test_every_role_is_allowed_or_refused_as_the_table_says(
    server: InProcessServer, role: str, expected: int, verb: str
) -> None:
    # Every role that holds run.approve is listed, so only the permission decides.
    await protect(server, approvers=["owner", "admin", "operator"])
    run_id, deploy, _ = await waiting_run(server)
    token = await server.mint(role)
    answer = await server.client.post(decide_path(run_id, deploy, verb), json={}, headers=server.auth(token))
    assert answer.status_code == expected, answer.text
    status = (await job_row(server, deploy))["status"]
    if expected == 403:
        assert answer.json() == {
            "error": "forbidden",
            "detail": "this route needs run.approve; role auditor does not have it",
        }
        assert status == "waiting_approval"
        async with server.state.db.read() as conn:
            denied = (
                await conn.execute(
                    select(access_log).where(
                        access_log.c.outcome == "denied", access_log.c.actor_role == role
                    )
                )
            ).all()
        assert denied
    else:
        assert status == ("queued" if verb == "approve" else "failed")


async def test_a_token_the_rule_does_not_name_is_refused_and_nothing_changes(server: InProcessServer) -> None:
    await protect(server, approvers=["admin", "release-bot"])
    run_id, deploy, _ = await waiting_run(server)
    operator = await server.mint("operator")
    answer = await server.client.post(
        decide_path(run_id, deploy, "approve"), json={"comment": "ok"}, headers=server.auth(operator)
    )
    assert answer.status_code == 403
    assert answer.json()["error"] == "not_an_approver"
    assert "admin, release-bot" in answer.json()["detail"]
    row = await job_row(server, deploy)
    assert (row["status"], row["approval"]) == ("waiting_approval", None)
    assert await queued(server, deploy) is None


async def test_a_scoped_token_decides_only_runs_of_its_key(server: InProcessServer) -> None:
    await protect(server, approvers=["operator"])
    mine, mine_job, _ = await waiting_run(server, routing_key="local:app")
    other, other_job, _ = await waiting_run(server, routing_key="local:other")
    scoped = await server.mint("operator", routing_key="local:app")
    refused = await server.client.post(decide_path(other, other_job, "approve"), headers=server.auth(scoped))
    assert refused.status_code == 404
    assert (await job_row(server, other_job))["status"] == "waiting_approval"
    allowed = await server.client.post(decide_path(mine, mine_job, "approve"), headers=server.auth(scoped))
    assert allowed.status_code == 200, allowed.text


async def test_approval_queues_the_job_after_the_wait_timer_with_the_decision_kept(
    server: InProcessServer,
) -> None:
    await protect(server, wait_timer_ms=600_000)
    run_id, deploy, _ = await waiting_run(server)
    admin = await server.mint("admin")
    before = utc_now()
    answer = await server.client.post(
        decide_path(run_id, deploy, "approve"), json={"comment": "ship it"}, headers=server.auth(admin)
    )
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["status"] == "queued"
    assert (body["approval"]["decision"], body["approval"]["comment"], body["approval"]["role"]) == (
        "approved",
        "ship it",
        "admin",
    )
    row = await job_row(server, deploy)
    assert row["reason"].startswith("waiting: wait timer until ")
    assert row["blocked_on"] is None
    queue_row = await queued(server, deploy)
    assert queue_row is not None and queue_row["not_before"] >= before + timedelta(minutes=9)
    async with server.state.db.read() as conn:
        kinds = [
            (r.kind, r.detail)
            for r in await conn.execute(select(run_timeline).where(run_timeline.c.job_id == deploy))
        ]
        logged = (
            await conn.execute(select(access_log).where(access_log.c.action == "runs.approve_job"))
        ).one()
    assert ("job.approved", {"by": admin_label(kinds), "role": "admin", "comment": "ship it"}) in kinds
    assert (logged.outcome, logged.target_id, logged.status_code) == ("allowed", deploy, 200)
    again = await server.client.post(decide_path(run_id, deploy, "reject"), headers=server.auth(admin))
    assert again.status_code == 409 and again.json()["error"] == "not_waiting"


def admin_label(kinds: list[tuple[str, Any]]) -> Any:
    return next(detail["by"] for kind, detail in kinds if kind == "job.approved")


async def test_rejection_fails_the_job_with_the_comment_and_skips_its_dependant(
    server: InProcessServer,
) -> None:
    await protect(server)
    run_id, deploy, announce = await waiting_run(server)
    admin = await server.mint("admin")
    answer = await server.client.post(
        decide_path(run_id, deploy, "reject"), json={"comment": "freeze week"}, headers=server.auth(admin)
    )
    assert answer.status_code == 200, answer.text
    row = await job_row(server, deploy)
    assert row["status"] == "failed"
    assert row["reason"].startswith("rejected: ") and row["reason"].endswith(": freeze week")
    dependant = await job_row(server, announce)
    assert (dependant["status"], dependant["reason"]) == ("skipped", "needs: deploy failed")
    run = (await server.client.get(f"{API}/runs/{run_id}", headers=server.auth())).json()
    assert run["status"] == "failed" and run["pending_approvals"] == []


async def test_the_triggering_token_may_not_approve_when_the_rule_says_so(server: InProcessServer) -> None:
    admin = await server.mint("admin")
    other_admin = await server.mint("admin")
    token_id = await token_id_of(server, admin)
    await protect(server, prevent_self_approval=True)
    run_id, deploy, _ = await waiting_run(server, triggered_by=token_id)
    refused = await server.client.post(decide_path(run_id, deploy, "approve"), headers=server.auth(admin))
    assert refused.status_code == 403 and refused.json()["error"] == "self_approval"
    allowed = await server.client.post(
        decide_path(run_id, deploy, "approve"), headers=server.auth(other_admin)
    )
    assert allowed.status_code == 200, allowed.text


async def token_id_of(server: InProcessServer, token: str) -> str:
    async with server.state.db.read() as conn:
        return str(
            (
                await conn.execute(
                    select(admin_tokens.c.id).where(admin_tokens.c.token_hash == hash_token(token))
                )
            ).scalar_one()
        )


async def test_run_show_says_who_may_approve_and_cancel_ends_a_waiting_job(server: InProcessServer) -> None:
    await protect(server, approvers=["admin", "release-bot"])
    run_id, deploy, announce = await waiting_run(server)
    run = (await server.client.get(f"{API}/runs/{run_id}", headers=server.auth())).json()
    assert [(w["job_id"], w["environment"], w["approvers"]) for w in run["pending_approvals"]] == [
        (deploy, "production", ["admin", "release-bot"])
    ]
    cancelled = await server.client.post(f"{API}/runs/{run_id}/cancel", json={}, headers=server.auth())
    assert cancelled.status_code == 202, cancelled.text
    assert cancelled.json()["cancelled"] >= 1
    assert (await job_row(server, deploy))["status"] == "cancelled"
    assert (await job_row(server, announce))["status"] in ("cancelled", "skipped")
    run = (await server.client.get(f"{API}/runs/{run_id}", headers=server.auth())).json()
    assert run["status"] == "cancelled"


async def test_held_jobs_older_than_the_retention_are_cancelled_with_that_reason(
    server: InProcessServer,
) -> None:
    await protect(server)
    _, old, _ = await waiting_run(server, age_days=31)
    _, fresh, _ = await waiting_run(server, age_days=29)
    async with server.state.db.transaction() as conn:
        assert await expire_held(conn, 0, utc_now()) == []  # 0 = never
        await expire_held(conn, 30, utc_now())
    row = await job_row(server, old)
    assert (row["status"], row["reason"]) == (
        "cancelled",
        "held_retention: waited more than 30 days for approval",
    )
    assert (await job_row(server, fresh))["status"] == "waiting_approval"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"approvers": []}, "approvers"),
        ({"approvers": ["auditor"]}, "approvers"),
        ({"approvers": ["admin"], "wait_timer_ms": -1}, "wait_timer_ms"),
        ({"approvers": ["admin"], "refs": [""]}, "refs"),
        ({"approvers": ["admin"], "colour": "red"}, "colour"),
    ],
)
async def test_a_bad_rule_is_refused_naming_the_field_and_changes_nothing(
    server: InProcessServer, body: dict[str, Any], field: str
) -> None:
    await server.client.put(f"{API}/environments/production", json={}, headers=server.auth())
    answer = await server.client.put(
        f"{API}/environments/production/protection", json=body, headers=server.auth()
    )
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"] == "invalid_body" and field in answer.json()["detail"]
    shown = (await server.client.get(f"{API}/environments/production", headers=server.auth())).json()
    assert shown["protection"] is None


async def test_protect_and_unprotect_an_environment(server: InProcessServer) -> None:
    shown = await protect(server, approvers=["admin", "bot"], refs=["main"], wait_timer_ms=1000)
    assert shown["protection"] == {
        "approvers": ["admin", "bot"],
        "refs": ["main"],
        "wait_timer_ms": 1000,
        "prevent_self_approval": False,
    }
    missing = await server.client.put(
        f"{API}/environments/nope/protection", json={"approvers": ["admin"]}, headers=server.auth()
    )
    assert missing.status_code == 404
    operator = await server.mint("operator")
    refused = await server.client.delete(
        f"{API}/environments/production/protection", headers=server.auth(operator)
    )
    assert refused.status_code == 403
    removed = await server.client.delete(f"{API}/environments/production/protection", headers=server.auth())
    assert removed.status_code == 204
    shown = (await server.client.get(f"{API}/environments/production", headers=server.auth())).json()
    assert shown["protection"] is None


async def released_to_production(server: InProcessServer) -> tuple[str, str]:
    """A run whose `announce` targets the protected `production` and is released by `deploy`'s end (deploy
    approved out of band), so the needs scheduler makes it wait: (run, announce)."""
    from conveyor.execution.lifecycle import finish_job

    await protect(server, approvers=["admin"], refs=["main"])
    run_id, deploy, announce = await waiting_run(server)
    async with server.state.db.transaction() as conn:
        await conn.execute(update(jobs).where(jobs.c.id == announce).values(environment="production"))
        await conn.execute(
            update(jobs)
            .where(jobs.c.id == deploy)
            .values(status="running", blocked_on=None, approval={"x": 1})
        )
        await finish_job(conn, deploy, "success")
    return run_id, announce


async def test_a_job_released_to_a_protected_environment_waits_and_asks_for_approval(
    server: InProcessServer,
) -> None:
    """The needs scheduler holds a job whose upstream succeeded, emits the event, and queues nothing."""
    run_id, announce = await released_to_production(server)
    row = await job_row(server, announce)
    assert (row["status"], row["blocked_on"]) == ("waiting_approval", "approval")
    assert row["reason"] == "waiting: approval for environment production (approvers: admin)"
    assert await queued(server, announce) is None
    async with server.state.db.read() as conn:
        emitted = (
            await conn.execute(
                select(events.c.name, events.c.payload).where(events.c.name == "conveyor.approval.requested")
            )
        ).all()
    assert len(emitted) == 1
    payload = emitted[0].payload
    assert (payload["job_id"], payload["environment"], payload["approvers"], payload["run_id"]) == (
        announce,
        "production",
        ["admin"],
        run_id,
    )


async def test_a_ref_outside_the_rule_fails_the_job_instead_of_waiting(server: InProcessServer) -> None:
    from conveyor.execution.lifecycle import finish_job

    await protect(server, approvers=["admin"], refs=["release/*"])
    _, deploy, announce = await waiting_run(server)
    async with server.state.db.transaction() as conn:
        await conn.execute(update(jobs).where(jobs.c.id == announce).values(environment="production"))
        await conn.execute(
            update(jobs).where(jobs.c.id == deploy).values(status="running", approval={"x": 1})
        )
        await finish_job(conn, deploy, "success")
    row = await job_row(server, announce)
    assert row["status"] == "failed"
    assert row["reason"] == (
        "environment_ref_not_allowed: ref refs/heads/main may not deploy to production; its refs are release/*"
    )


async def test_a_job_that_starts_waiting_is_told_to_the_rules_on_approval_requested_only(
    server: InProcessServer,
) -> None:
    """docs/design/events.md §10: `approval_requested` rules get one notification per wait, run-end rules none."""
    rules = {}
    for on, target in (
        (["approval_requested"], {"webhook": "http://127.0.0.1:9/hook"}),
        (["failed"], {"email": "a@b.c"}),
    ):
        added = await server.client.post(
            f"{API}/notification-rules", json={"on": on, **target}, headers=server.auth()
        )
        assert added.status_code == 201, added.text
        rules[on[0]] = added.json()["id"]
    listed = (await server.client.get(f"{API}/notification-rules", headers=server.auth())).json()["items"]
    assert sorted(r["on"][0] for r in listed) == ["approval_requested", "failed"]
    run_id, announce = await released_to_production(server)
    async with server.state.db.read() as conn:
        told = (
            await conn.execute(select(events.c.payload).where(events.c.name == "conveyor.notification"))
        ).all()
    assert len(told) == 1
    payload = told[0].payload
    assert (payload["rule_id"], payload["event"], payload["status"]) == (
        rules["approval_requested"],
        "approval_requested",
        "waiting_approval",
    )
    assert (
        payload["run_id"],
        payload["job_id"],
        payload["job"],
        payload["environment"],
        payload["approvers"],
    ) == (
        run_id,
        announce,
        "announce",
        "production",
        ["admin"],
    )
