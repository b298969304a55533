"""Admin authentication, RBAC, scopes, the access log and error shapes (docs/design/admin.md §2-§5, §9)."""

from datetime import UTC, datetime, timedelta

import pytest
from fastapi import APIRouter
from sqlalchemy import func, insert, select, text, update

from conveyor.admin.auth import RoutePermissionError
from conveyor.db.tables import access_log, admin_tokens
from conveyor.model.ids import new_id, utc_now
from conveyor.server.app import create_app
from conveyor.server.state import ServerState
from tests.support.inprocess import InProcessServer

UNAUTHENTICATED_PATHS = {"/health", "/ready", "/metrics", "/api/v1/openapi.json"}


async def access_rows(server: InProcessServer, **where: object) -> list[dict[str, object]]:
    query = select(access_log)
    for key, value in where.items():
        query = query.where(access_log.c[key] == value)
    async with server.state.db.read() as conn:
        return [dict(r._mapping) for r in await conn.execute(query)]


async def test_every_admin_route_declares_one_permission_and_refuses_anonymous_callers(
    server: InProcessServer,
) -> None:
    spec = (await server.client.get("/api/v1/openapi.json")).json()
    admin_operations = 0
    for path, operations in spec["paths"].items():
        assert path.startswith("/api/v1/admin/"), f"{path} is in the schema but not an admin route"
        for method, operation in operations.items():
            admin_operations += 1
            assert operation["x-conveyor-permission"], (method, path)
            assert isinstance(operation["x-conveyor-scoped"], bool)
            concrete = path.replace("{", "").replace("}", "")
            answer = await server.client.request(method.upper(), concrete)
            assert answer.status_code == 401, (method, path, answer.text)
            assert answer.json()["error"] == "unauthenticated"
    assert admin_operations >= 5


async def test_only_the_documented_routes_need_no_token(server: InProcessServer) -> None:
    paths = {getattr(route, "path", "") for route in server.app.routes}
    assert UNAUTHENTICATED_PATHS <= paths
    for path in UNAUTHENTICATED_PATHS:
        assert (await server.client.get(path)).status_code == 200, path


def test_an_admin_route_without_a_permission_refuses_to_start(server: InProcessServer) -> None:
    rogue = APIRouter()

    @rogue.get("/rogue")
    async def rogue_route() -> dict[str, str]:
        return {}

    state: ServerState = server.state
    with pytest.raises(RoutePermissionError, match="/api/v1/admin/rogue declares 0 permissions"):
        create_app(state, extra_admin_routers=[rogue])


async def test_auditor_is_refused_a_write_with_the_permission_named_and_a_denied_row(
    server: InProcessServer,
) -> None:
    auditor = await server.mint("auditor")
    answer = await server.client.post(
        "/api/v1/admin/tokens", json={"role": "admin"}, headers=server.auth(auditor)
    )
    assert answer.status_code == 403
    assert answer.json() == {
        "error": "forbidden",
        "detail": "this route needs token.manage; role auditor does not have it",
    }
    denied = await access_rows(server, outcome="denied", action="tokens.create")
    assert len(denied) == 1 and denied[0]["actor_role"] == "auditor" and denied[0]["status_code"] == 403


async def test_auditor_is_refused_before_the_body_is_read(server: InProcessServer) -> None:
    auditor = await server.mint("auditor")
    answer = await server.client.post(
        "/api/v1/admin/tokens",
        content=b"{not json",
        headers={**server.auth(auditor), "content-type": "application/json"},
    )
    assert answer.status_code == 403


async def test_scoped_token_is_refused_on_org_wide_routes(server: InProcessServer) -> None:
    scoped = await server.mint("owner", routing_key="github:acme/app")
    answer = await server.client.get("/api/v1/admin/tokens", headers=server.auth(scoped))
    assert answer.status_code == 403
    assert answer.json()["error"] == "token_scope"


async def test_revoked_and_expired_tokens_get_invalid_token(server: InProcessServer) -> None:
    created = await server.client.post(
        "/api/v1/admin/tokens", json={"role": "operator"}, headers=server.auth()
    )
    assert created.status_code == 201
    token, token_id = created.json()["token"], created.json()["id"]
    assert (await server.client.get("/api/v1/admin/db/status", headers=server.auth(token))).status_code == 200
    assert (
        await server.client.delete(f"/api/v1/admin/tokens/{token_id}", headers=server.auth())
    ).status_code == 204
    answer = await server.client.get("/api/v1/admin/db/status", headers=server.auth(token))
    assert answer.status_code == 401 and answer.json()["error"] == "invalid_token"

    expiring = await server.mint("operator")
    async with server.state.db.transaction() as conn:
        await conn.execute(
            update(admin_tokens)
            .where(admin_tokens.c.prefix == expiring[:16])
            .values(expires_at=datetime.now(UTC) - timedelta(seconds=1))
        )
    answer = await server.client.get("/api/v1/admin/db/status", headers=server.auth(expiring))
    assert answer.status_code == 401 and answer.json()["error"] == "invalid_token"


async def test_malformed_header_is_unauthenticated(server: InProcessServer) -> None:
    for header in ({"Authorization": "Basic abc"}, {"Authorization": "Bearer nope"}, {}):
        answer = await server.client.get("/api/v1/admin/tokens", headers=header)
        assert answer.status_code == 401 and answer.json()["error"] == "unauthenticated"


async def test_revoking_the_last_owner_token_is_refused(server: InProcessServer) -> None:
    listed = (await server.client.get("/api/v1/admin/tokens", headers=server.auth())).json()["items"]
    (owner,) = [t for t in listed if t["role"] == "owner"]
    answer = await server.client.delete(f"/api/v1/admin/tokens/{owner['id']}", headers=server.auth())
    assert answer.status_code == 409 and answer.json()["error"] == "last_owner"
    assert (await server.client.get("/api/v1/admin/tokens", headers=server.auth())).status_code == 200


async def test_token_list_never_shows_hashes_or_plaintext(server: InProcessServer) -> None:
    body = (await server.client.get("/api/v1/admin/tokens", headers=server.auth())).text
    assert server.owner_token not in body
    assert "token_hash" not in body


async def test_allowed_write_logs_its_row_and_stores_only_the_hash(server: InProcessServer) -> None:
    created = await server.client.post(
        "/api/v1/admin/tokens", json={"role": "auditor", "label": "ci"}, headers=server.auth()
    )
    rows = await access_rows(server, action="tokens.create", outcome="allowed")
    assert [r["target_id"] for r in rows] == [created.json()["id"]]
    async with server.state.db.read() as conn:
        stored = (
            await conn.execute(
                select(admin_tokens.c.token_hash).where(admin_tokens.c.id == created.json()["id"])
            )
        ).scalar_one()
    assert stored != created.json()["token"] and len(stored) == 64


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"label": "x", "role": "root"}, "role: must be one of owner, admin, operator, auditor"),
        ({"role": "admin", "colour": "red"}, "colour: is not a known field"),
    ],
)
async def test_invalid_body_names_the_field(
    server: InProcessServer, body: dict[str, str], field: str
) -> None:
    answer = await server.client.post("/api/v1/admin/tokens", json=body, headers=server.auth())
    assert answer.status_code == 422
    assert answer.json() == {"error": "invalid_body", "detail": field}


async def test_bad_query_and_oversized_body_have_the_error_shape(server: InProcessServer) -> None:
    answer = await server.client.get("/api/v1/admin/access-log?limit=0", headers=server.auth())
    assert answer.status_code == 400 and set(answer.json()) == {"error", "detail"}
    big = b'{"role": "admin", "label": "' + b"x" * (2 * 1024 * 1024) + b'"}'
    answer = await server.client.post(
        "/api/v1/admin/tokens", content=big, headers={**server.auth(), "content-type": "application/json"}
    )
    assert answer.status_code == 413 and answer.json()["error"] == "payload_too_large"
    async with server.state.db.read() as conn:
        assert (await conn.execute(select(func.count()).select_from(admin_tokens))).scalar_one() == 1


async def test_request_id_is_honoured_and_echoed(server: InProcessServer) -> None:
    answer = await server.client.get(
        "/api/v1/admin/tokens", headers={**server.auth(), "X-Request-Id": "abc_123"}
    )
    assert answer.headers["x-request-id"] == "abc_123"
    generated = await server.client.get("/health", headers={"X-Request-Id": "bad id!"})
    assert generated.headers["x-request-id"] != "bad id!" and len(generated.headers["x-request-id"]) == 36


async def test_paging_neither_skips_nor_repeats_rows_of_the_same_millisecond(server: InProcessServer) -> None:
    # Recent: rows older than `audit_retention_days` belong to the retention sweep.
    same_ms = utc_now().replace(microsecond=123000) - timedelta(minutes=1)
    rows = []
    for i in range(120):
        at = same_ms if i < 10 else same_ms - timedelta(milliseconds=i)
        rows.append(
            {
                "id": new_id(),
                "at": at,
                "actor_type": "system",
                "source": "http",
                "action": "seed",
                "outcome": "allowed",
                "status_code": 200,
            }
        )
    async with server.state.db.transaction() as conn:
        await conn.execute(insert(access_log), rows)
    seen: list[str] = []
    cursor = None
    while True:
        params = {"limit": 50, "action": "seed", **({"cursor": cursor} if cursor else {})}
        page = (
            await server.client.get("/api/v1/admin/access-log", params=params, headers=server.auth())
        ).json()
        seen += [item["id"] for item in page["items"]]
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert sorted(seen) == sorted(r["id"] for r in rows)
    assert len(seen) == len(set(seen)) == 120


async def test_cursor_reused_with_another_filter_is_invalid(server: InProcessServer) -> None:
    async with server.state.db.transaction() as conn:
        await conn.execute(
            insert(access_log),
            [
                {
                    "id": new_id(),
                    "at": datetime.now(UTC),
                    "actor_type": "system",
                    "source": "http",
                    "action": "seed",
                    "outcome": "allowed",
                    "status_code": 200,
                }
                for _ in range(3)
            ],
        )
    first = (
        await server.client.get(
            "/api/v1/admin/access-log", params={"limit": 1, "action": "seed"}, headers=server.auth()
        )
    ).json()
    assert first["next_cursor"]
    answer = await server.client.get(
        "/api/v1/admin/access-log",
        params={"limit": 1, "action": "other", "cursor": first["next_cursor"]},
        headers=server.auth(),
    )
    assert answer.status_code == 400 and answer.json()["error"] == "invalid_cursor"


async def test_failing_access_log_insert_rolls_back_the_write_but_reads_still_answer(
    server: InProcessServer,
) -> None:
    async with server.state.db.transaction() as conn:
        await conn.execute(text("ALTER TABLE access_log RENAME TO access_log_moved"))
    answer = await server.client.post("/api/v1/admin/tokens", json={"role": "auditor"}, headers=server.auth())
    assert answer.status_code == 503 and answer.json()["error"] == "unavailable"
    async with server.state.db.read() as conn:
        assert (await conn.execute(select(func.count()).select_from(admin_tokens))).scalar_one() == 1
    before = server.state.metrics.access_log_dropped._value.get()
    assert (await server.client.get("/api/v1/admin/tokens", headers=server.auth())).status_code == 200
    assert server.state.read_log is not None
    await server.state.read_log.flush()
    assert server.state.metrics.access_log_dropped._value.get() > before


async def test_reads_are_logged_best_effort(server: InProcessServer) -> None:
    assert (await server.client.get("/api/v1/admin/tokens", headers=server.auth())).status_code == 200
    assert server.state.read_log is not None
    await server.state.read_log.flush()
    rows = await access_rows(server, action="tokens.list")
    assert len(rows) == 1 and rows[0]["outcome"] == "allowed" and rows[0]["source"] == "http"


@pytest.mark.parametrize(
    ("path", "body", "action"),
    [
        ("/api/v1/admin/peers/join-tokens", {"role": "worker"}, "peers.join_token"),
        ("/api/v1/admin/peers/w1/revoke", None, "peers.revoke"),
    ],
)
async def test_peer_management_is_refused_to_an_operator_and_logged(
    server: InProcessServer, path: str, body: object, action: str
) -> None:
    operator = await server.mint("operator")
    assert (await server.client.post(path, json=body)).status_code == 401
    answer = await server.client.post(path, json=body, headers=server.auth(operator))
    assert answer.status_code == 403
    assert answer.json()["detail"] == "this route needs peer.manage; role operator does not have it"
    denied = await access_rows(server, outcome="denied", action=action, actor_role="operator")
    assert len(denied) == 1 and denied[0]["permission"] == "peer.manage"
