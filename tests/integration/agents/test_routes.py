"""Admin routes of agent tokens, agents and the queue: answers, permissions, hooks
(docs/design/admin.md §4)."""

from typing import Any

from sqlalchemy import select

from conveyor.agents.routes import DISCONNECTOR, KICKER, RUN_FINALIZER
from conveyor.db.tables import access_log, agent_tokens, dispatch_history, dispatch_queue, jobs
from conveyor.model.ids import utc_now
from tests.integration.agents.conftest import make_agent, make_run
from tests.support.inprocess import InProcessServer

API = "/api/v1/admin"


async def post(server: InProcessServer, path: str, body: Any = None, token: str | None = None) -> Any:
    return await server.client.post(API + path, json=body, headers=server.auth(token))


async def get(server: InProcessServer, path: str, token: str | None = None, **params: Any) -> Any:
    return await server.client.get(API + path, params=params, headers=server.auth(token))


async def test_a_minted_token_is_shown_once_and_listed_without_hash_or_plaintext(
    server: InProcessServer,
) -> None:
    created = await post(
        server, "/agent-tokens", {"label": "fleet", "labels": ["Linux", "gpu"], "mandatory_labels": ["gpu"]}
    )
    assert created.status_code == 201, created.text
    body = created.json()
    assert body["token"].startswith("cvy_agent_") and body["prefix"] == body["token"][:12]
    assert (body["labels"], body["mandatory_labels"], body["kind"]) == (["gpu", "linux"], ["gpu"], "static")

    listed = await get(server, "/agent-tokens")
    assert listed.status_code == 200
    assert body["token"] not in listed.text
    async with server.state.db.read() as conn:
        token_hash = (await conn.execute(select(agent_tokens.c.token_hash))).scalar_one()
    assert token_hash not in listed.text
    [item] = listed.json()["items"]
    assert item["id"] == body["id"] and "token" not in item and "token_hash" not in item


async def test_mint_refuses_reserved_or_malformed_labels_and_stray_mandatory_ones(
    server: InProcessServer,
) -> None:
    for bad in (
        {"labels": ["conveyor:os:linux"]},
        {"labels": ["two words"]},
        {"labels": ["linux"], "mandatory_labels": ["gpu"]},
        {"labels": ["linux"], "role": "owner"},
    ):
        answer = await post(server, "/agent-tokens", bad)
        assert answer.status_code == 422, (bad, answer.text)
        assert answer.json()["error"] == "invalid_body"


async def test_revoking_a_token_calls_the_kicker_and_a_second_revoke_conflicts(
    server: InProcessServer,
) -> None:
    kicked: list[str] = []

    async def kicker(token_id: str) -> None:
        kicked.append(token_id)

    server.state.parts.put(KICKER, kicker)
    token_id = (await post(server, "/agent-tokens", {"labels": ["linux"]})).json()["id"]
    revoked = await server.client.delete(f"{API}/agent-tokens/{token_id}", headers=server.auth())
    assert revoked.status_code == 204
    assert kicked == [token_id]
    again = await server.client.delete(f"{API}/agent-tokens/{token_id}", headers=server.auth())
    assert again.status_code == 409
    missing = await server.client.delete(f"{API}/agent-tokens/nope", headers=server.auth())
    assert missing.status_code == 404
    [item] = (await get(server, "/agent-tokens")).json()["items"]
    assert item["revoked_at"] is not None


async def test_an_auditor_reads_agents_and_the_queue_but_mints_revokes_and_clears_nothing(
    server: InProcessServer,
) -> None:
    auditor = await server.mint("auditor")
    for path in ("/agent-tokens", "/agents", "/queue"):
        assert (await get(server, path, auditor)).status_code == 200, path
    denied = await post(server, "/agent-tokens", {"labels": ["linux"]}, auditor)
    assert denied.status_code == 403
    assert denied.json() == {
        "error": "forbidden",
        "detail": "this route needs agent.manage; role auditor does not have it",
    }
    assert (await post(server, "/queue/clear", {"confirm": True}, auditor)).status_code == 403
    assert (await post(server, "/agents/a1/disconnect", None, auditor)).status_code == 403


async def test_an_operator_mints_agent_tokens_and_each_write_is_in_the_access_log(
    server: InProcessServer,
) -> None:
    operator = await server.mint("operator")
    created = await post(server, "/agent-tokens", {"labels": ["linux"]}, operator)
    assert created.status_code == 201
    async with server.state.db.read() as conn:
        rows = (
            await conn.execute(select(access_log).where(access_log.c.action == "agent_tokens.create"))
        ).all()
    assert [(r.outcome, r.target_id, r.status_code) for r in rows] == [("allowed", created.json()["id"], 201)]


async def test_agents_are_listed_filtered_by_label_and_shown(server: InProcessServer) -> None:
    async with server.state.db.transaction() as conn:
        await make_agent(conn, "a-gpu", ["gpu", "linux"])
        await make_agent(conn, "a-cpu", ["linux"], state="offline")
    everyone = (await get(server, "/agents")).json()["items"]
    assert {a["agent_id"] for a in everyone} == {"a-gpu", "a-cpu"}
    gpu = (await get(server, "/agents", label="GPU")).json()["items"]
    assert [a["agent_id"] for a in gpu] == ["a-gpu"]
    assert (await get(server, "/agents", label="gp")).json()["items"] == []
    shown = await get(server, "/agents/a-cpu")
    assert shown.status_code == 200 and shown.json()["state"] == "offline"
    assert (await get(server, "/agents/nope")).status_code == 404


async def test_agents_page_with_a_cursor(server: InProcessServer) -> None:
    async with server.state.db.transaction() as conn:
        for n in range(5):
            await make_agent(conn, f"agent-{n}", ["linux"])
    first = (await get(server, "/agents", limit=2)).json()
    second = (await get(server, "/agents", limit=2, cursor=first["next_cursor"])).json()
    third = (await get(server, "/agents", limit=2, cursor=second["next_cursor"])).json()
    seen = [a["agent_id"] for page in (first, second, third) for a in page["items"]]
    assert sorted(seen) == [f"agent-{n}" for n in range(5)] and third["next_cursor"] is None


async def test_disconnect_goes_through_the_endpoint_hook_or_conflicts(server: InProcessServer) -> None:
    async with server.state.db.transaction() as conn:
        await make_agent(conn, "online-1", ["linux"])
        await make_agent(conn, "gone-1", ["linux"], state="offline")
    no_hook = await post(server, "/agents/online-1/disconnect")
    assert no_hook.status_code == 409
    assert no_hook.json() == {"error": "conflict", "detail": "agent not connected to this node"}

    asked: list[str] = []

    async def disconnector(agent_id: str) -> bool:
        asked.append(agent_id)
        return agent_id == "online-1"

    server.state.parts.put(DISCONNECTOR, disconnector)
    assert (await post(server, "/agents/online-1/disconnect")).status_code == 202
    assert (await post(server, "/agents/gone-1/disconnect")).status_code == 409
    assert (await post(server, "/agents/nope/disconnect")).status_code == 404
    assert asked == ["online-1"]


async def test_the_queue_lists_waiting_and_claimed_jobs_with_their_note(server: InProcessServer) -> None:
    async with server.state.db.transaction() as conn:
        made = await make_run(
            conn, {"build": "queued", "test": "dispatched", "lint": "queued", "docs": "pending"}
        )
        await conn.execute(
            dispatch_queue.update()
            .where(dispatch_queue.c.job_id == made.job_ids["lint"])
            .values(
                unschedulable="unschedulable: no connected agent or scaler matches [gpu]",
                unschedulable_since=dispatch_queue.c.enqueued_at,
            )
        )
    items = {row["display_name"]: row for row in (await get(server, "/queue")).json()["items"]}
    assert set(items) == {"build", "test", "lint"}
    assert items["lint"]["note"] == "unschedulable: no connected agent or scaler matches [gpu]"
    assert items["build"]["note"].startswith("waiting: ")
    assert (items["test"]["state"], items["test"]["agent_id"], items["test"]["note"]) == (
        "claimed",
        "agent-1",
        None,
    )
    assert items["build"]["run_number"] == 1 and items["build"]["workflow"] == "ci"

    claimed_only = (await get(server, "/queue", state="claimed")).json()["items"]
    assert [r["display_name"] for r in claimed_only] == ["test"]
    assert (await get(server, "/queue", state="bogus")).status_code == 400
    shown = await get(server, f"/queue/{made.job_ids['build']}")
    assert shown.status_code == 200 and shown.json()["job_id"] == made.job_ids["build"]
    assert (await get(server, f"/queue/{made.job_ids['docs']}")).status_code == 404


async def test_clearing_the_queue_cancels_queued_jobs_only_and_hands_their_runs_on(
    server: InProcessServer,
) -> None:
    finalized: list[list[str]] = []

    async def finalizer(run_ids: list[str]) -> None:
        finalized.append(run_ids)

    server.state.parts.put(RUN_FINALIZER, finalizer)
    async with server.state.db.transaction() as conn:
        first = await make_run(conn, {"build": "queued", "test": "dispatched"}, number=1)
        second = await make_run(conn, {"build": "queued", "lint": "queued"}, number=2)

    refused = await post(server, "/queue/clear", {"confirm": False})
    assert refused.status_code == 400
    cleared = await post(server, "/queue/clear", {"confirm": True})
    assert cleared.status_code == 200, cleared.text
    body = cleared.json()
    cancelled = {first.job_ids["build"], second.job_ids["build"], second.job_ids["lint"]}
    assert body["cancelled"] == 3 and set(body["job_ids"]) == cancelled
    assert set(body["run_ids"]) == {first.run_id, second.run_id}
    assert [set(ids) for ids in finalized] == [{first.run_id, second.run_id}]

    async with server.state.db.read() as conn:
        statuses = {r.id: (r.status, r.reason) for r in await conn.execute(select(jobs))}
        queue_left = [r.job_id for r in await conn.execute(select(dispatch_queue))]
        history = {r.job_id: r.outcome for r in await conn.execute(select(dispatch_history))}
    for job_id in cancelled:
        assert statuses[job_id] == ("cancelled", "admin_clear")
    assert statuses[first.job_ids["test"]] == ("dispatched", None)
    assert queue_left == [first.job_ids["test"]]
    assert history == dict.fromkeys(cancelled, "cancelled")

    again = (await post(server, "/queue/clear", {"confirm": True})).json()
    assert again["cancelled"] == 0 and len(finalized) == 1


async def test_clear_leaves_a_job_that_is_no_longer_queued(server: InProcessServer) -> None:
    async with server.state.db.transaction() as conn:
        made = await make_run(conn, {"build": "queued"})
        # A claim that moved the job on but had not yet touched the row (the guarded UPDATE loses).
        # Seen just now, so the leader's heartbeat check leaves it alone meanwhile.
        await conn.execute(
            jobs.update()
            .where(jobs.c.id == made.job_ids["build"])
            .values(status="dispatched", last_heartbeat_at=utc_now())
        )
    body = (await post(server, "/queue/clear", {"confirm": True})).json()
    assert body["cancelled"] == 0
    async with server.state.db.read() as conn:
        assert (await conn.execute(select(dispatch_queue.c.job_id))).scalar_one() == made.job_ids["build"]
        assert (await conn.execute(select(dispatch_history))).first() is None
