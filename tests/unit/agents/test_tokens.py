"""Agent token values and the registration label rules (docs/design/execution.md §6)."""

from datetime import UTC, datetime, timedelta

import pytest

from conveyor.agents.tokens import (
    AgentTokenRow,
    check_registration_labels,
    display_prefix,
    generate_agent_token,
    hash_token,
    looks_like_agent_token,
    normalise_labels,
)

NOW = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def token(
    kind: str = "static", labels: tuple[str, ...] = ("linux", "docker"), **extra: object
) -> AgentTokenRow:
    values: dict[str, object] = {
        "id": "t1",
        "org_id": "default",
        "label": None,
        "kind": kind,
        "prefix": "cvy_agent_ab",
        "labels": list(labels),
        "mandatory_labels": [],
        "agent_id": None,
        "single_use": kind == "ephemeral",
        "consumed_at": None,
        "created_by": "test",
        "created_at": NOW,
        "expires_at": None,
        "revoked_at": None,
        "last_used_at": None,
        **extra,
    }
    return AgentTokenRow(**values)  # type: ignore[arg-type]


def test_a_new_token_has_the_documented_shape_and_a_twelve_character_prefix() -> None:
    value = generate_agent_token()
    assert looks_like_agent_token(value)
    assert len(value) == len("cvy_agent_") + 64
    assert display_prefix(value) == value[:12]
    assert hash_token(value) != value and len(hash_token(value)) == 64
    assert generate_agent_token() != value


@pytest.mark.parametrize(
    "value",
    [
        "",
        "cvy_agent_",
        "cvy_admin_" + "a" * 64,
        "cvy_agent_" + "A" * 64,
        "cvy_agent_" + "a" * 63,
        " cvy_agent_" + "a" * 64,
    ],
)
def test_values_without_the_token_shape_are_recognised(value: str) -> None:
    assert not looks_like_agent_token(value)


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ([], []),
        (["Linux", " linux ", "LINUX"], ["linux"]),
        (["gpu", "", "  ", "Docker"], ["docker", "gpu"]),
        (["b", "a", "c"], ["a", "b", "c"]),
    ],
)
def test_labels_are_stripped_lowercased_deduplicated_and_sorted(
    given: list[str], expected: list[str]
) -> None:
    assert normalise_labels(given) == expected


@pytest.mark.parametrize(
    ("kind", "requested", "refusal"),
    [
        ("static", ["linux"], None),
        ("static", ["linux", "docker"], None),
        ("static", ["LINUX", " Docker "], None),
        ("static", [], None),
        ("static", ["linux", "conveyor:os:linux", "conveyor:arch:x86_64", "conveyor:host:build-1"], None),
        ("static", ["gpu"], "label_not_allowed"),
        ("static", ["linux", "GPU"], "label_not_allowed"),
        ("static", ["conveyor:gpu"], "label_reserved"),
        ("static", ["conveyor:os:"], "label_reserved"),
        ("static", ["conveyor:scaler:local"], "label_reserved"),
        ("static", ["Conveyor:Admin"], "label_reserved"),
        ("ephemeral", ["linux", "docker", "conveyor:host:vm-7"], None),
        ("ephemeral", ["linux", "extra"], "label_not_allowed"),
        ("ephemeral", ["conveyor:pool:x"], "label_reserved"),
    ],
)
def test_registration_labels_must_stay_within_the_token(
    kind: str, requested: list[str], refusal: str | None
) -> None:
    reason = check_registration_labels(token(kind), requested)
    if refusal is None:
        assert reason is None
    else:
        assert reason is not None and reason.startswith(refusal + ":"), reason


def test_a_refusal_names_the_offending_label() -> None:
    reason = check_registration_labels(token(), ["linux", "gpu"])
    assert reason is not None and "gpu" in reason and "linux" in reason


def test_a_token_is_live_until_revoked_expired_or_consumed() -> None:
    assert token().is_live(NOW)
    assert not token(revoked_at=NOW).is_live(NOW)
    assert not token(expires_at=NOW).is_live(NOW)
    assert token(expires_at=NOW + timedelta(seconds=1)).is_live(NOW)
    assert not token("ephemeral", consumed_at=NOW).is_live(NOW)
