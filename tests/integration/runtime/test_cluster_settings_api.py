"""`GET/PATCH cluster-settings` (docs/design/cluster.md §5.2) on both dialects, through the real app."""

from sqlalchemy import select

from conveyor.db.tables import access_log
from conveyor.model.knobs import CLUSTER_KNOBS
from conveyor.runtime import runtime_services
from tests.support.inprocess import InProcessServer

URL = "/api/v1/admin/cluster-settings"


async def settings_version(server: InProcessServer) -> int:
    answer = await server.client.get(URL, headers=server.auth())
    assert answer.status_code == 200, answer.text
    return int(answer.json()["version"])


async def test_before_any_change_every_knob_is_unset_at_version_zero(server: InProcessServer) -> None:
    body = (await server.client.get(URL, headers=server.auth())).json()
    assert body["version"] == 0
    assert set(body["settings"]) == {knob.name for knob in CLUSTER_KNOBS}
    assert all(value is None for value in body["settings"].values())
    assert body["effective"]["firecracker_api_socket_wait_ms"] == 5000
    assert body["defaults"] == body["effective"]


async def test_a_change_bumps_the_version_once_and_the_same_value_again_does_not(
    server: InProcessServer,
) -> None:
    first = await server.client.patch(
        URL, json={"firecracker_api_socket_wait_ms": 7000}, headers=server.auth()
    )
    assert first.status_code == 200, first.text
    assert first.json()["version"] == 1
    assert first.json()["changed"] == ["firecracker_api_socket_wait_ms"]
    assert first.json()["settings"]["firecracker_api_socket_wait_ms"] == 7000
    assert first.json()["effective"]["firecracker_api_socket_wait_ms"] == 7000

    again = await server.client.patch(
        URL, json={"firecracker_api_socket_wait_ms": 7000}, headers=server.auth()
    )
    assert again.status_code == 200
    assert again.json()["version"] == 1 and again.json()["changed"] == []
    empty = await server.client.patch(URL, json={}, headers=server.auth())
    assert empty.json()["version"] == 1 and empty.json()["changed"] == []


async def test_null_clears_a_value_back_to_its_default(server: InProcessServer) -> None:
    await server.client.patch(URL, json={"reroute_max_hops": 5}, headers=server.auth())
    cleared = await server.client.patch(URL, json={"reroute_max_hops": None}, headers=server.auth())
    assert cleared.json()["settings"]["reroute_max_hops"] is None
    assert cleared.json()["effective"]["reroute_max_hops"] == 3
    assert cleared.json()["version"] == 2


async def test_an_unknown_key_answers_400_naming_the_nearest_key_and_changes_nothing(
    server: InProcessServer,
) -> None:
    await server.client.patch(URL, json={"queue_max_depth": 10}, headers=server.auth())
    answer = await server.client.patch(
        URL, json={"reroute_max_hop": 2, "queue_max_depth": 20}, headers=server.auth()
    )
    assert answer.status_code == 400
    assert answer.json()["error"] == "unknown_setting"
    assert "reroute_max_hop" in answer.json()["detail"] and "reroute_max_hops" in answer.json()["detail"]
    body = (await server.client.get(URL, headers=server.auth())).json()
    assert body["version"] == 1 and body["settings"]["queue_max_depth"] == 10


async def test_a_negative_wait_is_out_of_range_naming_the_key_and_changes_nothing(
    server: InProcessServer,
) -> None:
    answer = await server.client.patch(
        URL, json={"firecracker_api_socket_wait_ms": -1}, headers=server.auth()
    )
    assert answer.status_code == 400
    assert answer.json()["error"] == "out_of_range"
    assert "firecracker_api_socket_wait_ms must be between 100 and 60000" in answer.json()["detail"]
    assert await settings_version(server) == 0


async def test_validation_codes_of_the_acceptance_scenario(server: InProcessServer) -> None:
    cases = [
        ({"reroute_max_hop": 2}, "unknown_setting"),
        ({"agent_token_ttl_ms": 10}, "out_of_range"),
        ({"queue_max_depth": "5"}, "invalid_value"),
        ({"queue_max_depth": True}, "invalid_value"),
        ({"queue_max_depth": 5.0}, "invalid_value"),
        ({"scaler_provision_backoff_base_ms": 3_600_000}, "invalid_combination"),
    ]
    for body, code in cases:
        answer = await server.client.patch(URL, json=body, headers=server.auth())
        assert (answer.status_code, answer.json()["error"]) == (400, code), body
        assert set(answer.json()) == {"error", "detail"}
    assert await settings_version(server) == 0


async def test_a_body_that_is_not_an_object_is_422_invalid_body(server: InProcessServer) -> None:
    answer = await server.client.patch(URL, json=[1, 2], headers=server.auth())
    assert answer.status_code == 422 and answer.json()["error"] == "invalid_body"
    broken = await server.client.patch(
        URL, content=b"{not json", headers={**server.auth(), "content-type": "application/json"}
    )
    assert broken.status_code == 422 and broken.json()["error"] == "invalid_body"


async def test_a_scoped_token_is_refused_with_token_scope(server: InProcessServer) -> None:
    scoped = await server.mint("owner", routing_key="github:acme/app")
    answer = await server.client.get(URL, headers=server.auth(scoped))
    assert answer.status_code == 403 and answer.json()["error"] == "token_scope"


async def test_an_operator_may_read_but_not_write(server: InProcessServer) -> None:
    operator = await server.mint("operator")
    assert (await server.client.get(URL, headers=server.auth(operator))).status_code == 200
    answer = await server.client.patch(URL, json={"queue_max_depth": 5}, headers=server.auth(operator))
    assert answer.status_code == 403 and "cluster_settings.write" in answer.json()["detail"]


async def test_a_change_is_access_logged_in_its_transaction(server: InProcessServer) -> None:
    await server.client.patch(URL, json={"queue_max_depth": 5}, headers=server.auth())
    async with server.state.db.read() as conn:
        rows = (
            await conn.execute(select(access_log).where(access_log.c.action == "cluster_settings.update"))
        ).all()
    assert len(rows) == 1
    assert rows[0].target_type == "cluster_settings" and rows[0].outcome == "allowed"


async def test_the_writer_reads_its_own_change_at_once_through_the_resolver(server: InProcessServer) -> None:
    resolver = runtime_services(server.state.parts).settings
    assert await resolver.cluster_value("reroute_flap_grace_ms") == 120_000
    await server.client.patch(URL, json={"reroute_flap_grace_ms": 60_000}, headers=server.auth())
    assert await resolver.cluster_value("reroute_flap_grace_ms") == 60_000
    assert resolver.served_version == 1
