"""Admin peer routes (docs/design/cluster.md §7.3, docs/design/admin.md §4): join tokens, the peer list,
revoke, permissions."""

from datetime import datetime

import pytest
from sqlalchemy import select

from conveyor.cluster.auth import hash_join_token
from conveyor.db.tables import join_tokens
from tests.support.inprocess import InProcessServer

JOIN_TOKENS = "/api/v1/admin/peers/join-tokens"


async def test_a_join_token_is_created_once_and_only_its_hash_is_stored(server: InProcessServer) -> None:
    answer = await server.client.post(JOIN_TOKENS, json={"role": "worker"}, headers=server.auth())
    assert answer.status_code == 201, answer.text
    body = answer.json()
    assert set(body) == {"id", "token", "expires_at"} and body["token"].startswith("cvy_join_")
    async with server.state.db.read() as conn:
        row = (await conn.execute(select(join_tokens))).one()
    assert row.token_hash == hash_join_token(body["token"]) and row.role == "worker"
    lifetime = row.expires_at - row.created_at
    assert lifetime.total_seconds() == 3600  # the default hour
    assert datetime.fromisoformat(body["expires_at"].replace("Z", "+00:00")) == row.expires_at


@pytest.mark.parametrize("expires_in_ms", [59_999, 7 * 24 * 3600 * 1000 + 1, 0, -5])
async def test_a_join_token_lifetime_outside_a_minute_to_seven_days_is_400(
    server: InProcessServer, expires_in_ms: int
) -> None:
    answer = await server.client.post(
        JOIN_TOKENS, json={"role": "worker", "expires_in_ms": expires_in_ms}, headers=server.auth()
    )
    assert answer.status_code == 400 and answer.json()["error"] == "out_of_range"
    assert "expires_in_ms" in answer.json()["detail"]


@pytest.mark.parametrize("body", [{"role": "admin"}, {"role": "worker", "colour": "red"}, {}])
async def test_a_bad_join_token_body_is_refused_with_the_field_named(
    server: InProcessServer, body: dict[str, object]
) -> None:
    answer = await server.client.post(JOIN_TOKENS, json=body, headers=server.auth())
    assert answer.status_code == 422 and answer.json()["error"] == "invalid_body"


@pytest.mark.parametrize(
    ("method", "path"),
    [("POST", JOIN_TOKENS), ("POST", "/api/v1/admin/peers/w1/revoke")],
)
@pytest.mark.parametrize("role", ["operator", "auditor"])
async def test_peer_management_needs_peer_manage(
    server: InProcessServer, method: str, path: str, role: str
) -> None:
    token = await server.mint(role)
    answer = await server.client.request(method, path, json={"role": "worker"}, headers=server.auth(token))
    assert answer.status_code == 403
    assert answer.json()["detail"] == f"this route needs peer.manage; role {role} does not have it"


async def test_the_peer_list_needs_peer_read_which_an_auditor_has(server: InProcessServer) -> None:
    assert (await server.client.get("/api/v1/admin/peers")).status_code == 401
    auditor = await server.mint("auditor")
    answer = await server.client.get("/api/v1/admin/peers", headers=server.auth(auditor))
    assert answer.status_code == 200 and answer.json() == {"items": [], "next_cursor": None}


async def test_new_peer_routes_declare_their_permission_in_openapi(server: InProcessServer) -> None:
    spec = (await server.client.get("/api/v1/openapi.json")).json()["paths"]
    assert spec["/api/v1/admin/peers"]["get"]["x-conveyor-permission"] == "peer.read"
    assert spec["/api/v1/admin/peers/join-tokens"]["post"]["x-conveyor-permission"] == "peer.manage"
    assert spec["/api/v1/admin/peers/{instance_id}/revoke"]["post"]["x-conveyor-permission"] == "peer.manage"


async def test_cluster_health_details_need_a_token_with_peer_read(server: InProcessServer) -> None:
    anonymous = await server.client.get("/cluster/health")
    assert anonymous.status_code == 200 and set(anonymous.json()) == {"status"}
    bogus = await server.client.get(
        "/cluster/health", headers={"Authorization": "Bearer cvy_admin_" + "0" * 64}
    )
    assert set(bogus.json()) == {"status"}
    detailed = (await server.client.get("/cluster/health", headers=server.auth())).json()
    assert detailed["status"] == "healthy" and detailed["role"] == "coordinator" and detailed["peers"] == []
    assert detailed["instance_id"] == server.state.instance_id
