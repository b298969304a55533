"""Peer messages (docs/design/cluster.md §2.4): discriminated on `type`, extra fields kept, unknown types
ignored."""

import pytest

from conveyor.cluster.messages import AuthRequest, Heartbeat, InvalidMessage, parse_message


def heartbeat(**extra: object) -> dict[str, object]:
    return {
        "type": "peer.heartbeat",
        "instance_id": "w1",
        "role": "worker",
        "at": "2025-03-01T12:00:00.000Z",
        "software_version": "1.0",
        **extra,
    }


def test_a_message_parses_into_the_model_its_type_names() -> None:
    message = parse_message(heartbeat())
    assert isinstance(message, Heartbeat) and message.instance_id == "w1" and message.agents == []


def test_unknown_fields_are_kept() -> None:
    message = parse_message(heartbeat(future_field={"x": 1}))
    assert message is not None and message.wire()["future_field"] == {"x": 1}


def test_an_unknown_type_is_ignored_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("INFO"):
        assert parse_message({"type": "peer.teleport", "x": 1}) is None
    assert "peer.teleport" in caplog.text


def test_an_invalid_known_message_raises_with_its_id_and_the_field() -> None:
    with pytest.raises(InvalidMessage) as caught:
        parse_message({"type": "peer.heartbeat", "message_id": "m1", "instance_id": "w1"})
    assert caught.value.message_id == "m1" and "role" in caught.value.detail


def test_heartbeat_labels_are_lower_cased_on_arrival() -> None:
    message = parse_message(
        heartbeat(
            agents=[{"agent_id": "a", "labels": ["Linux", "GPU"], "mandatory_labels": ["Secure"]}],
            scalers=[{"name": "s", "backend": "container", "label_sets": [["X64", "Linux"]]}],
        )
    )
    assert isinstance(message, Heartbeat)
    assert message.agents[0].labels == ["linux", "gpu"] and message.agents[0].mandatory_labels == ["secure"]
    assert message.scalers[0].label_sets == [["x64", "linux"]]


@pytest.mark.parametrize(
    "credentials",
    [{}, {"join_token": "cvy_join_x", "proof": "abc"}],
)
def test_an_auth_request_needs_exactly_one_of_token_or_proof(credentials: dict[str, str]) -> None:
    with pytest.raises(InvalidMessage, match="exactly one of join_token or proof"):
        parse_message(
            {"type": "peer.auth.request", "instance_id": "w1", "software_version": "1", **credentials}
        )


def test_an_auth_request_has_no_role_field_to_trust() -> None:
    message = parse_message(
        {
            "type": "peer.auth.request",
            "instance_id": "w1",
            "software_version": "1",
            "proof": "p",
            "role": "coordinator",
        }
    )
    assert isinstance(message, AuthRequest) and "role" not in AuthRequest.model_fields
