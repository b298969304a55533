"""Admin routes of secrets, environments and variables: values never leave, scopes with `/` route."""

import json

import pytest
from sqlalchemy import delete, select

from conveyor.admin import store as admin_store
from conveyor.admin.tokens import display_prefix
from conveyor.db.tables import access_log, admin_tokens, secrets
from tests.support.inprocess import InProcessServer

API = "/api/v1/admin"
VALUE = "s3cr3t-value-that-must-never-be-echoed"


async def make_environment(server: InProcessServer, name: str = "prod", **body: object) -> dict[str, object]:
    answer = await server.client.put(f"{API}/environments/{name}", json=body, headers=server.auth())
    assert answer.status_code in (200, 201), answer.text
    return dict(answer.json())


async def test_a_secret_is_created_then_replaced_and_no_answer_holds_its_value(
    server: InProcessServer,
) -> None:
    created = await server.client.put(
        f"{API}/secrets/org/DEPLOY_TOKEN", json={"value": VALUE}, headers=server.auth()
    )
    assert created.status_code == 201
    assert set(created.json()) == {
        "id",
        "scope",
        "name",
        "key_version",
        "created_at",
        "updated_at",
        "updated_by",
        "updated_by_name",
    }
    replaced = await server.client.put(
        f"{API}/secrets/org/DEPLOY_TOKEN", json={"value": VALUE + "2"}, headers=server.auth()
    )
    assert replaced.status_code == 200 and replaced.json()["id"] == created.json()["id"]
    listed = await server.client.get(f"{API}/secrets", headers=server.auth())
    assert [i["name"] for i in listed.json()["items"]] == ["DEPLOY_TOKEN"]
    status = await server.client.get(f"{API}/secrets/rotation", headers=server.auth())
    for answer in (created, replaced, listed, status):
        assert VALUE not in answer.text


async def test_the_secret_list_names_the_token_that_last_updated_each_secret(server: InProcessServer) -> None:
    async with server.state.db.transaction() as conn:
        labelled, _ = await admin_store.insert_token(conn, role="admin", created_by="test", label="ci-bot")
        unlabelled, _ = await admin_store.insert_token(conn, role="operator", created_by="test")
    async with server.state.db.transaction() as conn:
        gone, gone_row = await admin_store.insert_token(conn, role="admin", created_by="test", label="old")
    for name, token in (("A", labelled), ("B", server.owner_token), ("C", gone)):
        answer = await server.client.put(
            f"{API}/secrets/org/{name}", json={"value": VALUE}, headers=server.auth(token)
        )
        assert answer.status_code == 201, answer.text
    async with server.state.db.transaction() as conn:
        await conn.execute(delete(admin_tokens).where(admin_tokens.c.id == gone_row.id))
    listed = await server.client.get(f"{API}/secrets", headers=server.auth(unlabelled))
    names = {item["name"]: item["updated_by_name"] for item in listed.json()["items"]}
    owner_prefix = display_prefix(server.owner_token)
    assert names == {"A": "ci-bot", "B": f"owner token {owner_prefix}…", "C": f"deleted token {gone_row.id}"}


@pytest.mark.parametrize("scope_in_path", ["env/prod", "env%2Fprod"])
async def test_a_scope_containing_a_slash_routes_plain_or_percent_encoded(
    server: InProcessServer, scope_in_path: str
) -> None:
    await make_environment(server)
    url = f"{API}/secrets/{scope_in_path}/DEPLOY_TOKEN"
    answer = await server.client.put(url, json={"value": VALUE}, headers=server.auth())
    assert answer.status_code == 201, answer.text
    assert (answer.json()["scope"], answer.json()["name"]) == ("env/prod", "DEPLOY_TOKEN")
    listed = await server.client.get(f"{API}/secrets", params={"scope": "env/prod"}, headers=server.auth())
    assert [(i["scope"], i["name"]) for i in listed.json()["items"]] == [("env/prod", "DEPLOY_TOKEN")]
    assert (await server.client.delete(url, headers=server.auth())).status_code == 204
    assert (await server.client.delete(url, headers=server.auth())).status_code == 404


async def test_source_scopes_with_a_colon_route(server: InProcessServer) -> None:
    url = f"{API}/secrets/source:0190abcd-ef01/webhook_secret"
    assert (await server.client.put(url, json={"value": VALUE}, headers=server.auth())).status_code == 201
    listed = await server.client.get(
        f"{API}/secrets", params={"scope": "source:0190abcd-ef01"}, headers=server.auth()
    )
    assert [i["name"] for i in listed.json()["items"]] == ["webhook_secret"]


async def test_a_secret_of_an_environment_that_does_not_exist_is_404(server: InProcessServer) -> None:
    answer = await server.client.put(
        f"{API}/secrets/env/nowhere/TOKEN", json={"value": VALUE}, headers=server.auth()
    )
    assert answer.status_code == 404
    assert "environment set nowhere" in answer.json()["detail"]


@pytest.mark.parametrize(
    ("path", "code"),
    [
        ("secrets/team/TOKEN", "invalid_scope"),
        ("secrets/org/9BAD", "invalid_secret_name"),
        ("secrets/env/Prod/T", "invalid_scope"),
    ],
)
async def test_bad_scopes_and_names_are_400_naming_the_rule(
    server: InProcessServer, path: str, code: str
) -> None:
    answer = await server.client.put(f"{API}/{path}", json={"value": VALUE}, headers=server.auth())
    assert answer.status_code == 400
    assert answer.json()["error"] == code


async def test_a_value_over_64_kib_or_an_unknown_field_is_422(server: InProcessServer) -> None:
    too_big = await server.client.put(
        f"{API}/secrets/org/BIG", json={"value": "x" * (64 * 1024 + 1)}, headers=server.auth()
    )
    assert too_big.status_code == 422 and too_big.json()["error"] == "invalid_body"
    assert "x" * 100 not in too_big.text
    exact = await server.client.put(
        f"{API}/secrets/org/BIG", json={"value": "x" * (64 * 1024)}, headers=server.auth()
    )
    assert exact.status_code == 201
    extra = await server.client.put(
        f"{API}/secrets/org/X", json={"value": "v", "note": "n"}, headers=server.auth()
    )
    assert extra.status_code == 422 and "note" in extra.json()["detail"]


async def test_an_auditor_reads_metadata_but_cannot_write_and_an_admin_cannot_rotate(
    server: InProcessServer,
) -> None:
    auditor, admin = await server.mint("auditor"), await server.mint("admin")
    assert (await server.client.get(f"{API}/secrets", headers=server.auth(auditor))).status_code == 200
    refused = await server.client.put(
        f"{API}/secrets/org/T", json={"value": VALUE}, headers=server.auth(auditor)
    )
    assert refused.status_code == 403 and "secret.write" in refused.json()["detail"]
    assert (
        await server.client.put(f"{API}/secrets/org/T", json={"value": VALUE}, headers=server.auth(admin))
    ).status_code == 201
    rotate = await server.client.post(f"{API}/secrets/rotate-key", headers=server.auth(admin))
    assert rotate.status_code == 403 and "secret.rotate_key" in rotate.json()["detail"]


async def test_every_write_is_in_the_access_log_without_the_value(server: InProcessServer) -> None:
    await make_environment(server, variables={"REGION": "eu"})
    await server.client.put(f"{API}/secrets/env/prod/TOKEN", json={"value": VALUE}, headers=server.auth())
    await server.client.put(f"{API}/variables/TEAM", json={"value": "ci"}, headers=server.auth())
    await server.client.delete(f"{API}/secrets/env/prod/TOKEN", headers=server.auth())
    async with server.state.db.read() as conn:
        rows = [dict(r._mapping) for r in await conn.execute(select(access_log))]
    actions = {(r["action"], r["target_id"], r["status_code"]) for r in rows}
    assert ("secrets.set", "env/prod/TOKEN", 201) in actions
    assert ("secrets.delete", "env/prod/TOKEN", 204) in actions
    assert ("variables.set", "TEAM", 201) in actions
    assert VALUE not in json.dumps(rows, default=str)


async def test_environments_are_created_updated_shown_listed_and_deleted_with_their_secrets(
    server: InProcessServer,
) -> None:
    created = await server.client.put(
        f"{API}/environments/prod",
        json={"variables": {"REGION": "eu"}, "allowed_branches": ["main", "release/*"]},
        headers=server.auth(),
    )
    assert created.status_code == 201
    assert created.json()["allowed_branches"] == ["main", "release/*"]
    updated = await server.client.put(
        f"{API}/environments/prod", json={"variables": {"REGION": "us"}}, headers=server.auth()
    )
    assert updated.status_code == 200
    assert updated.json()["variables"] == {"REGION": "us"}
    assert updated.json()["allowed_branches"] == ["main", "release/*"]  # omitted: kept
    shown = await server.client.get(f"{API}/environments/prod", headers=server.auth())
    assert shown.json()["id"] == created.json()["id"]
    listed = await server.client.get(f"{API}/environments", headers=server.auth())
    assert [e["name"] for e in listed.json()["items"]] == ["prod"]

    await server.client.put(f"{API}/secrets/env/prod/TOKEN", json={"value": VALUE}, headers=server.auth())
    assert (await server.client.delete(f"{API}/environments/prod", headers=server.auth())).status_code == 204
    assert (await server.client.get(f"{API}/environments/prod", headers=server.auth())).status_code == 404
    async with server.state.db.read() as conn:
        assert (await conn.execute(select(secrets.c.id).where(secrets.c.scope == "env/prod"))).first() is None


async def test_bad_environment_input_is_refused(server: InProcessServer) -> None:
    bad_name = await server.client.put(f"{API}/environments/Prod", json={}, headers=server.auth())
    assert bad_name.status_code == 400 and bad_name.json()["error"] == "invalid_environment_name"
    reserved = await server.client.put(
        f"{API}/environments/prod", json={"variables": {"PATH": "/x"}}, headers=server.auth()
    )
    assert reserved.status_code == 400 and reserved.json()["error"] == "invalid_variable_name"
    assert (await server.client.delete(f"{API}/environments/prod", headers=server.auth())).status_code == 404


async def test_org_variables_are_set_listed_replaced_and_deleted(server: InProcessServer) -> None:
    assert (
        await server.client.put(f"{API}/variables/REGION", json={"value": "eu"}, headers=server.auth())
    ).status_code == 201
    assert (
        await server.client.put(f"{API}/variables/REGION", json={"value": "us"}, headers=server.auth())
    ).status_code == 200
    assert (
        await server.client.put(f"{API}/variables/TEAM", json={"value": "ci"}, headers=server.auth())
    ).status_code == 201
    listed = await server.client.get(f"{API}/variables", headers=server.auth())
    assert [(v["name"], v["value"]) for v in listed.json()["items"]] == [("REGION", "us"), ("TEAM", "ci")]
    assert (await server.client.delete(f"{API}/variables/REGION", headers=server.auth())).status_code == 204
    assert (await server.client.delete(f"{API}/variables/REGION", headers=server.auth())).status_code == 404
    bad = await server.client.put(f"{API}/variables/CONVEYOR_X", json={"value": "1"}, headers=server.auth())
    assert bad.status_code == 400


async def test_the_openapi_document_has_no_value_field_in_any_secret_answer(server: InProcessServer) -> None:
    spec = (await server.client.get("/api/v1/openapi.json")).json()
    schemas = spec["components"]["schemas"]
    for name in ("SecretOut", "RotationStatusOut", "RotationOut", "VersionOut"):
        assert "value" not in schemas[name]["properties"], name
    put = spec["paths"]["/api/v1/admin/secrets/{scope}/{name}"]["put"]
    assert put["x-conveyor-permission"] == "secret.write"
