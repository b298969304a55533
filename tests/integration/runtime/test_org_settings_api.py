"""`GET/PATCH org-settings/{org}` and the org → cluster → default resolver (docs/design/cluster.md §6)."""

from conveyor.runtime import runtime_services
from tests.support.inprocess import InProcessServer

ORG_URL = "/api/v1/admin/org-settings/default"
CLUSTER_URL = "/api/v1/admin/cluster-settings"
KNOB = "reroute_spawn_max_attempts"


async def test_an_org_without_a_row_inherits_everything_at_version_zero(server: InProcessServer) -> None:
    body = (await server.client.get(ORG_URL, headers=server.auth())).json()
    assert body["org_id"] == "default" and body["version"] == 0
    assert all(value is None for value in body["settings"].values())
    assert body["effective"][KNOB] == 3
    assert body["effective"]["ingest_max_concurrency"] is None
    assert body["effective"]["dispatch_ack_timeout_ms"] == 10_000


async def test_an_unknown_org_is_404(server: InProcessServer) -> None:
    for method in ("GET", "PATCH"):
        answer = await server.client.request(
            method, "/api/v1/admin/org-settings/acme", json={}, headers=server.auth()
        )
        assert answer.status_code == 404 and answer.json()["error"] == "not_found", method


async def test_org_override_wins_over_cluster_which_wins_over_default_and_unset_restores(
    server: InProcessServer,
) -> None:
    resolver = runtime_services(server.state.parts).settings
    assert await resolver.org_value("default", KNOB) == 3

    cluster = await server.client.patch(CLUSTER_URL, json={KNOB: 5}, headers=server.auth())
    assert cluster.status_code == 200
    assert (await server.client.get(ORG_URL, headers=server.auth())).json()["effective"][KNOB] == 5
    assert await resolver.org_value("default", KNOB) == 5

    org = await server.client.patch(ORG_URL, json={KNOB: 2}, headers=server.auth())
    assert org.status_code == 200, org.text
    assert org.json()["version"] == 1 and org.json()["changed"] == [KNOB]
    assert org.json()["settings"][KNOB] == 2 and org.json()["effective"][KNOB] == 2
    assert await resolver.org_value("default", KNOB) == 2

    unset_org = await server.client.patch(ORG_URL, json={KNOB: None}, headers=server.auth())
    assert unset_org.json()["effective"][KNOB] == 5 and unset_org.json()["version"] == 2
    assert await resolver.org_value("default", KNOB) == 5

    await server.client.patch(CLUSTER_URL, json={KNOB: None}, headers=server.auth())
    assert (await server.client.get(ORG_URL, headers=server.auth())).json()["effective"][KNOB] == 3
    assert await resolver.org_value("default", KNOB) == 3


async def test_same_value_again_keeps_the_org_version(server: InProcessServer) -> None:
    await server.client.patch(ORG_URL, json={"queue_timeout_ms": 600_000}, headers=server.auth())
    again = await server.client.patch(ORG_URL, json={"queue_timeout_ms": 600_000}, headers=server.auth())
    assert again.json()["version"] == 1 and again.json()["changed"] == []


async def test_org_patch_errors_are_400_and_change_nothing(server: InProcessServer) -> None:
    cases = [
        ({"queue_max_depth": 5}, "unknown_setting"),
        ({"reroute_spawn_max_attempts": 0}, "out_of_range"),
        ({"ingest_max_concurrency": "10"}, "invalid_value"),
    ]
    for body, code in cases:
        answer = await server.client.patch(ORG_URL, json=body, headers=server.auth())
        assert (answer.status_code, answer.json()["error"]) == (400, code), body
    assert (await server.client.get(ORG_URL, headers=server.auth())).json()["version"] == 0


async def test_an_auditor_reads_but_cannot_write_org_settings(server: InProcessServer) -> None:
    auditor = await server.mint("auditor")
    assert (await server.client.get(ORG_URL, headers=server.auth(auditor))).status_code == 200
    answer = await server.client.patch(ORG_URL, json={KNOB: 2}, headers=server.auth(auditor))
    assert answer.status_code == 403 and "org_settings.write" in answer.json()["detail"]


async def test_a_scoped_token_is_refused_with_token_scope(server: InProcessServer) -> None:
    scoped = await server.mint("admin", routing_key="github:acme/app")
    answer = await server.client.get(ORG_URL, headers=server.auth(scoped))
    assert answer.status_code == 403 and answer.json()["error"] == "token_scope"
