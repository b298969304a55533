"""Hostile webhook bodies and headers: a clear 400, nothing stored, nothing long echoed back."""

import json

import pytest

from conveyor.model.errors import MAX_ECHO_CHARS
from tests.support.inprocess import InProcessServer

DEEP = b"[" * 3000 + b"]" * 3000
DEEP_OBJECT = b'{"a":' * 5000 + b"1" + b"}" * 5000
HUGE_INT = b'{"n": ' + b"9" * 5000 + b"}"
LONG = "x" * 60_000


async def open_source(server: InProcessServer, kind: str) -> str:
    body: dict[str, object] = {"kind": kind, "name": f"{kind}-hooks"}
    if kind == "generic":
        body.update(verify="none", event_header="X-Event")
    else:
        body.update(verify="none", repo="team/app", clone_url="file:///nowhere")
    created = await server.client.post("/api/v1/admin/sources", json=body, headers=server.auth())
    assert created.status_code == 201, created.text
    return str(created.json()["id"])


async def deliveries(server: InProcessServer) -> list[str]:
    """The stored deliveries' ids."""
    page = await server.client.get("/api/v1/admin/deliveries", headers=server.auth())
    assert page.status_code == 200, page.text
    return [row["id"] for row in page.json()["items"]]


@pytest.mark.parametrize("kind", ["generic", "git"])
@pytest.mark.parametrize(
    "body",
    [DEEP, DEEP_OBJECT, HUGE_INT, b"\xff\xfe not utf-8", b"{not json", b"[1, 2]"],
    ids=["deep-array", "deep-object", "huge-int", "bad-utf8", "bad-json", "not-an-object"],
)
async def test_an_undecodable_body_answers_400_and_stores_nothing(
    server: InProcessServer, kind: str, body: bytes
) -> None:
    source_id = await open_source(server, kind)
    answer = await server.client.post(
        f"/webhooks/{source_id}", content=body, headers={"Content-Type": "application/json"}
    )
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"] == "invalid_request"
    assert answer.json()["detail"].startswith("body ")
    assert await deliveries(server) == []


@pytest.mark.parametrize("kind", ["generic", "git"])
@pytest.mark.parametrize(
    ("body", "holds"),
    [
        (b'{"ref": "refs/heads/main", "n": NaN}', "NaN"),
        (b'{"ref": "refs/heads/main", "n": [Infinity]}', "Infinity"),
        (b'{"ref": "refs/heads/main", "n": {"k": "a\\u0000b"}}', "NUL"),
        (b'{"ref": "refs/heads/main", "a\\u0000": 1}', "NUL"),
    ],
    ids=["nan", "infinity", "nul-value", "nul-key"],
)
async def test_a_body_the_database_cannot_store_answers_400_and_stores_nothing(
    server: InProcessServer, kind: str, body: bytes, holds: str
) -> None:
    source_id = await open_source(server, kind)
    answer = await server.client.post(
        f"/webhooks/{source_id}", content=body, headers={"Content-Type": "application/json"}
    )
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"] == "invalid_request" and holds in answer.json()["detail"], answer.text
    assert await deliveries(server) == []


async def test_a_nul_in_the_webhook_path_is_a_400(server: InProcessServer) -> None:
    answer = await server.client.post("/webhooks/%00", content=b"{}")
    assert answer.status_code == 400 and answer.json()["error"] == "invalid_request", answer.text


@pytest.mark.parametrize(
    ("kind", "header"),
    [
        ("git", "X-Gitea-Event"),
        ("git", "X-GitHub-Event"),
        ("git", "X-Gitea-Delivery"),
        ("generic", "X-Event"),
        ("generic", "X-Delivery-Id"),
    ],
)
async def test_an_event_action_or_delivery_header_over_256_characters_is_refused(
    server: InProcessServer, kind: str, header: str
) -> None:
    source_id = await open_source(server, kind)
    body = json.dumps({"ref": "refs/heads/main", "after": "a" * 40}).encode()
    exactly = await server.client.post(
        f"/webhooks/{source_id}",
        content=body,
        headers={"Content-Type": "application/json", header: "e" * 256},
    )
    assert exactly.status_code == 202, exactly.text
    before = await deliveries(server)
    answer = await server.client.post(
        f"/webhooks/{source_id}", content=body, headers={"Content-Type": "application/json", header: LONG}
    )
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"] == "invalid_request"
    assert len(answer.text) < 400
    assert await deliveries(server) == before


async def test_an_error_echoes_at_most_100_characters_of_any_input(server: InProcessServer) -> None:
    for path in (f"/webhooks/{LONG}", f"/api/v1/admin/runs/{LONG}", f"/api/v1/admin/agents/{LONG}"):
        answer = (
            await server.client.post(path)
            if "webhooks" in path
            else await server.client.get(path, headers=server.auth())
        )
        assert 400 <= answer.status_code < 500, answer.text
        assert "x" * (MAX_ECHO_CHARS + 1) not in answer.text
        assert "x" * 50 in answer.text  # still says which value it was about
    deep = await server.client.post(
        "/api/v1/admin/sources",
        content=DEEP,
        headers={**server.auth(), "Content-Type": "application/json"},
    )
    assert deep.status_code == 400, deep.text
    assert deep.json().get("error") == "invalid_request", deep.text


async def test_report_checks_is_accepted_on_create_and_patch(server: InProcessServer) -> None:
    body = {
        "kind": "github",
        "name": "acme/app",
        "repo": "acme/app",
        "webhook_secret": "s",
        "report": "checks",
    }
    created = await server.client.post("/api/v1/admin/sources", json=body, headers=server.auth())
    assert created.status_code == 201, created.text
    assert created.json()["report"] == "checks"
    other = await server.client.post(
        "/api/v1/admin/sources",
        json={**body, "name": "acme/lib", "repo": "acme/lib", "report": "statuses"},
        headers=server.auth(),
    )
    assert other.status_code == 201, other.text
    patched = await server.client.patch(
        f"/api/v1/admin/sources/{other.json()['id']}", json={"report": "checks"}, headers=server.auth()
    )
    assert patched.status_code == 200, patched.text
    shown = await server.client.get(f"/api/v1/admin/sources/{other.json()['id']}", headers=server.auth())
    assert shown.json()["report"] == "checks"
    bad = await server.client.patch(
        f"/api/v1/admin/sources/{other.json()['id']}", json={"report": "annotations"}, headers=server.auth()
    )
    assert bad.status_code in (400, 422) and "error" in bad.json(), bad.text
