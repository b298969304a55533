"""The `event` backend's pure parts: its `scalers.yaml` keys, the worker refusal, claim codes, the
per-address throttle and the claim URL of `conveyor agent --claim` (docs/design/scaler.md §6.4)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import yaml

from conveyor.cli.agent import claim_base_url
from conveyor.model.knobs import CLUSTER_KNOBS_BY_NAME
from conveyor.scaler import claims
from conveyor.scaler.config import Host, ScalerConfigError, parse_config, worker_refusal
from conveyor.scaler.event import EventBackend

HOST = Host(os="linux", arch="x86_64", platform="linux")

EVENT = """
version: 1
scalers:
  - name: cloud
    type: event
    max_agents: 3
    provisioning_targets: [acme/infra]
    provisioning_label: provisioner
    label_sets:
      - labels: [cloud, big]
"""


def parse(text: str) -> Any:
    return parse_config(
        [("main.yaml", yaml.safe_load(text), True)], host=HOST, registry={"event": EventBackend}
    )


def problems(text: str) -> list[str]:
    with pytest.raises(ScalerConfigError) as caught:
        parse(text)
    return caught.value.problems


def test_an_event_scaler_is_accepted_with_its_keys() -> None:
    (entry,) = parse(EVENT).entries
    assert entry.type == "event" and entry.max_agents == 3
    assert entry.options["provisioning_targets"] == ["acme/infra"]
    assert entry.options["provisioning_label"] == "provisioner"
    assert entry.label_sets[0].labels == ("big", "cloud")


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (("    provisioning_targets: [acme/infra]\n", ""), "provisioning_targets: required"),
        (("[acme/infra]", "[]"), "provisioning_targets: required"),
        (("[acme/infra]", "acme/infra"), "provisioning_targets: required"),
        (("    provisioning_label: provisioner\n", ""), "provisioning_label: required"),
        (("provisioning_label: provisioner", "provisioning_label: conveyor:os:linux"), "is reserved"),
        (
            ("labels: [cloud, big]", "labels: [cloud, provisioner]"),
            "label_sets[0]: holds the provisioning label",
        ),
        (("max_agents: 3\n", "max_agents: 3\n    claim_ttl_s: 0\n"), "claim_ttl_s: must be a positive"),
        (("max_agents: 3\n", "max_agents: 3\n    claim_ttl_s: true\n"), "claim_ttl_s: must be a positive"),
        (("max_agents: 3\n", "max_agents: 3\n    image: x\n"), "unknown key image"),
    ],
)
def test_each_bad_key_is_named(change: tuple[str, str], expected: str) -> None:
    found = problems(EVENT.replace(*change))
    assert any(expected in p and "scalers[cloud]" in p for p in found), found


def test_a_claim_ttl_is_read() -> None:
    (entry,) = parse(EVENT.replace("max_agents: 3\n", "max_agents: 3\n    claim_ttl_s: 30\n")).entries
    assert entry.options["claim_ttl_s"] == 30


def test_a_worker_refuses_an_event_scaler_with_a_clear_message() -> None:
    refusal = worker_refusal(parse(EVENT))
    assert refusal is not None and "cloud" in refusal and "only on a coordinator" in refusal
    empty = parse("version: 1\nscalers: []\n")
    assert worker_refusal(empty) is None


def test_claim_codes_are_random_and_stored_as_sha256() -> None:
    first, second = claims.generate_claim_code(), claims.generate_claim_code()
    assert first != second and first.startswith("cvy_claim_") and len(first) == len("cvy_claim_") + 64
    assert claims.hash_code(first) == claims.hash_code(first) and len(claims.hash_code(first)) == 64
    assert first not in claims.hash_code(first)


def test_the_throttle_allows_n_attempts_per_address_per_window() -> None:
    throttle = claims.ClaimThrottle(attempts=3, window_s=60)
    assert [throttle.allow("a", t) for t in (0.0, 1.0, 2.0)] == [None, None, None]
    assert throttle.allow("a", 3.0) == pytest.approx(57.0)
    assert throttle.allow("b", 3.0) is None  # another address has its own window
    assert throttle.allow("a", 59.9) == pytest.approx(0.1)
    assert throttle.allow("a", 60.0) is None  # the attempt at 0 left the window
    assert throttle.allow("a", 60.5) == pytest.approx(0.5)  # 1, 2 and 60 are still in it
    assert throttle.allow("a", 61.0) is None  # the attempt at 1 left
    assert throttle.allow("a", 61.5) == pytest.approx(0.5)  # refused: 2, 60, 61 are in the window


def test_the_throttle_forgets_quiet_addresses() -> None:
    throttle = claims.ClaimThrottle(attempts=1, window_s=10)
    for index in range(100):
        throttle.allow(f"10.0.0.{index}", 0.0)
    throttle.allow("late", 11.0)
    assert list(throttle._seen) == ["late"]


def test_the_retention_boundary() -> None:
    now = datetime(2026, 1, 2, tzinfo=UTC)
    assert claims.purge_before(now, 24 * 3600 * 1000) == now - timedelta(days=1)
    # The retention is the cluster knob `scaler_claim_retention_ms` (docs/design/scaler.md §6.4).
    assert CLUSTER_KNOBS_BY_NAME["scaler_claim_retention_ms"].default == 24 * 3600 * 1000
    assert claims.DEFAULT_CLAIM_TTL_S == 300


@pytest.mark.parametrize(
    ("given", "base"),
    [
        ("http://h:8470", "http://h:8470"),
        ("http://h:8470/", "http://h:8470"),
        ("https://ci.example/conveyor/", "https://ci.example/conveyor"),
        ("ws://h:8470/ws", "http://h:8470"),
        ("wss://ci.example/ws", "https://ci.example"),
        ("WS://h:1/ws/", "http://h:1"),
    ],
)
def test_the_claim_is_redeemed_at_the_http_base(given: str, base: str) -> None:
    assert claim_base_url(given) == base


@pytest.mark.parametrize("given", ["ftp://h", "h:8470", "", "http://"])
def test_a_url_that_is_not_http_or_ws_is_refused(given: str) -> None:
    with pytest.raises(ValueError, match="--url must be"):
        claim_base_url(given)
