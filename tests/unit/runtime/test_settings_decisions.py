"""Pure settings decisions: PATCH planning, precedence, version classification
(docs/design/cluster.md §5–§6)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conveyor.model.knobs import CLUSTER_KNOBS, CLUSTER_KNOBS_BY_NAME, ORG_KNOBS_BY_NAME
from conveyor.runtime.settings import (
    SettingsRejected,
    classify_settings_version,
    effective_values,
    nearest_setting,
    plan_settings_change,
    resolve_setting,
)

DEFAULTS = {knob.name: knob.default for knob in CLUSTER_KNOBS} | {
    name: knob.default for name, knob in ORG_KNOBS_BY_NAME.items()
}
UNSET = dict.fromkeys(CLUSTER_KNOBS_BY_NAME)


def plan(body: dict[str, object], stored: dict[str, int | None] | None = None):  # type: ignore[no-untyped-def]
    return plan_settings_change(body, stored or UNSET, knobs=CLUSTER_KNOBS_BY_NAME, defaults=DEFAULTS)


def rejection(body: dict[str, object], stored: dict[str, int | None] | None = None) -> SettingsRejected:
    with pytest.raises(SettingsRejected) as caught:
        plan(body, stored)
    return caught.value


def test_a_new_value_is_a_change() -> None:
    change = plan({"firecracker_api_socket_wait_ms": 7000})
    assert change.changed == ["firecracker_api_socket_wait_ms"] and change.bumps_version
    assert change.values["firecracker_api_socket_wait_ms"] == 7000


def test_the_stored_value_again_is_no_change() -> None:
    stored = {**UNSET, "firecracker_api_socket_wait_ms": 7000}
    change = plan({"firecracker_api_socket_wait_ms": 7000}, stored)
    assert change.changed == [] and not change.bumps_version


def test_storing_the_default_explicitly_is_a_change_of_the_stored_value() -> None:
    assert plan({"reroute_max_hops": 3}).changed == ["reroute_max_hops"]


def test_an_empty_body_changes_nothing() -> None:
    assert plan({}).changed == []


def test_null_clears_a_stored_value_and_null_on_unset_is_no_change() -> None:
    assert plan({"reroute_max_hops": None}, {**UNSET, "reroute_max_hops": 5}).changed == ["reroute_max_hops"]
    assert plan({"reroute_max_hops": None}).changed == []


def test_an_omitted_key_keeps_its_stored_value() -> None:
    change = plan({"queue_max_depth": 5}, {**UNSET, "reroute_max_hops": 5})
    assert change.values["reroute_max_hops"] == 5


def test_unknown_key_names_the_nearest_valid_key() -> None:
    error = rejection({"reroute_max_hop": 2})
    assert error.code == "unknown_setting"
    assert "reroute_max_hop" in error.detail and "did you mean reroute_max_hops?" in error.detail


def test_unknown_key_wins_over_other_problems_in_the_same_body() -> None:
    assert rejection({"queue_max_depth": "x", "nonsense_key_zzz": 1}).code == "unknown_setting"


@pytest.mark.parametrize("value", ["5", True, False, 5.0, 1.5, [1], {"a": 1}])
def test_non_integers_are_invalid_values(value: object) -> None:
    error = rejection({"queue_max_depth": value})
    assert error.code == "invalid_value" and "queue_max_depth" in error.detail


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("agent_token_ttl_ms", 10),
        ("firecracker_api_socket_wait_ms", -1),
        ("firecracker_api_socket_wait_ms", 60_001),
        ("reroute_max_hops", 0),
        ("reroute_max_hops", 11),
    ],
)
def test_values_outside_the_range_are_out_of_range_with_the_range_in_the_detail(
    name: str, value: int
) -> None:
    error = rejection({name: value})
    knob = CLUSTER_KNOBS_BY_NAME[name]
    assert error.code == "out_of_range"
    assert f"between {knob.minimum} and {knob.maximum}" in error.detail and str(value) in error.detail


@pytest.mark.parametrize("name", sorted(CLUSTER_KNOBS_BY_NAME))
def test_both_bounds_are_inclusive(name: str) -> None:
    knob = CLUSTER_KNOBS_BY_NAME[name]
    # Keep the backoff pair ordered whichever end of it is tested.
    roomy = {**UNSET, "scaler_provision_backoff_base_ms": 1000, "scaler_provision_backoff_max_ms": 86_400_000}
    for value in (knob.minimum, knob.maximum):
        stored = dict(roomy)
        if name == "scaler_provision_backoff_base_ms":
            stored["scaler_provision_backoff_max_ms"] = 3_600_000
        if name == "scaler_provision_backoff_max_ms":
            stored["scaler_provision_backoff_base_ms"] = 1000
        assert plan({name: value}, stored).values[name] == value


def test_backoff_base_above_the_effective_max_is_an_invalid_combination() -> None:
    error = rejection({"scaler_provision_backoff_base_ms": 3_600_000})  # default max is 15 min
    assert error.code == "invalid_combination"
    assert (
        "scaler_provision_backoff_base_ms" in error.detail
        and "scaler_provision_backoff_max_ms" in error.detail
    )


def test_lowering_the_max_below_the_stored_base_is_an_invalid_combination() -> None:
    stored = {**UNSET, "scaler_provision_backoff_base_ms": 60_000}
    assert rejection({"scaler_provision_backoff_max_ms": 30_000}, stored).code == "invalid_combination"


def test_raising_both_together_is_valid() -> None:
    change = plan(
        {"scaler_provision_backoff_base_ms": 3_600_000, "scaler_provision_backoff_max_ms": 7_200_000}
    )
    assert len(change.changed) == 2


def test_the_combination_uses_env_defaults_for_unset_values() -> None:
    defaults = {**DEFAULTS, "scaler_provision_backoff_max_ms": 10_000}
    with pytest.raises(SettingsRejected):
        plan_settings_change(
            {"scaler_provision_backoff_base_ms": 20_000},
            UNSET,
            knobs=CLUSTER_KNOBS_BY_NAME,
            defaults=defaults,
        )


def test_org_knobs_validate_against_their_own_set() -> None:
    org_unset = dict.fromkeys(ORG_KNOBS_BY_NAME)
    change = plan_settings_change(
        {"reroute_spawn_max_attempts": 2, "queue_timeout_ms": 0},
        org_unset,
        knobs=ORG_KNOBS_BY_NAME,
        defaults=DEFAULTS,
    )
    assert change.changed == ["reroute_spawn_max_attempts", "queue_timeout_ms"]
    with pytest.raises(SettingsRejected) as caught:
        plan_settings_change({"queue_max_depth": 2}, org_unset, knobs=ORG_KNOBS_BY_NAME, defaults=DEFAULTS)
    assert caught.value.code == "unknown_setting"


knob_values = st.sampled_from(sorted(CLUSTER_KNOBS_BY_NAME)).flatmap(
    lambda name: st.tuples(
        st.just(name),
        st.one_of(
            st.none(),
            st.integers(CLUSTER_KNOBS_BY_NAME[name].minimum, CLUSTER_KNOBS_BY_NAME[name].maximum),
        ),
    )
)


@given(stored=st.lists(knob_values, max_size=6), body=st.lists(knob_values, max_size=6))
def test_the_version_bumps_exactly_when_some_stored_value_differs(
    stored: list[tuple[str, int | None]], body: list[tuple[str, int | None]]
) -> None:
    before = {**UNSET, **dict(stored)}
    patch = dict(body)
    try:
        change = plan(patch, before)
    except SettingsRejected as exc:
        assert exc.code == "invalid_combination"
        return
    assert change.bumps_version == any(before[name] != value for name, value in patch.items())
    assert plan(patch, change.values).changed == []  # applying it twice changes nothing the second time


def test_nearest_setting_gives_none_for_nonsense() -> None:
    assert nearest_setting("zzzzzz", CLUSTER_KNOBS_BY_NAME) is None


def test_effective_values_fall_back_to_defaults() -> None:
    effective = effective_values({**UNSET, "reroute_max_hops": 7}, DEFAULTS, CLUSTER_KNOBS_BY_NAME)
    assert effective["reroute_max_hops"] == 7 and effective["queue_max_depth"] == 1000


# --- precedence (docs/design/cluster.md §6)


def test_org_override_wins_over_cluster_which_wins_over_default() -> None:
    name = "reroute_spawn_max_attempts"
    assert resolve_setting(name, org={name: 2}, cluster={name: 5}, defaults=DEFAULTS) == 2
    assert resolve_setting(name, org={name: None}, cluster={name: 5}, defaults=DEFAULTS) == 5
    assert resolve_setting(name, org=None, cluster={name: None}, defaults=DEFAULTS) == 3
    assert resolve_setting(name, org=None, cluster=None, defaults={**DEFAULTS, name: 4}) == 4


def test_an_org_only_knob_falls_back_to_its_default_and_may_be_unlimited() -> None:
    assert resolve_setting("queue_timeout_ms", org={}, cluster=UNSET, defaults=DEFAULTS) == 3_600_000
    assert resolve_setting("ingest_max_concurrency", org={}, cluster=UNSET, defaults=DEFAULTS) is None


def test_an_org_cannot_override_a_cluster_only_knob() -> None:
    assert (
        resolve_setting("queue_max_depth", org={"queue_max_depth": 1}, cluster=UNSET, defaults=DEFAULTS)
        == 1000
    )


def test_an_unknown_name_is_a_key_error() -> None:
    with pytest.raises(KeyError):
        resolve_setting("nope", org=None, cluster=None, defaults=DEFAULTS)


@pytest.mark.parametrize(
    ("applied", "current", "status"),
    [(3, 3, "in-sync"), (0, 0, "in-sync"), (2, 3, "behind"), (0, 1, "behind"), (4, 3, "ahead")],
)
def test_classify_settings_version(applied: int, current: int, status: str) -> None:
    assert classify_settings_version(applied, current) == status
