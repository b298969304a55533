"""Pure membership decisions: staleness, reconnect backoff, peer URLs, `/cluster/health` status, registry."""

import pytest

from conveyor.cluster.messages import Heartbeat
from conveyor.cluster.registry import PeerRegistry, is_stale
from conveyor.cluster.routes import health_status
from conveyor.cluster.service import peer_socket_url, reconnect_delay


def test_a_peer_is_stale_only_after_missing_all_its_beats() -> None:
    assert not is_stale(10.0, 10.6, interval_ms=200, stale_beats=3)
    assert is_stale(10.0, 10.61, interval_ms=200, stale_beats=3)


def test_reconnect_backoff_starts_at_one_second_grows_by_half_and_caps_at_sixty() -> None:
    assert reconnect_delay(0, 0.0) == 1.0
    assert reconnect_delay(1, 0.0) == 1.5
    assert reconnect_delay(2, 0.0) == pytest.approx(2.25)
    assert reconnect_delay(30, 0.0) == 60.0
    assert reconnect_delay(1000, 0.99) == 60.0


def test_reconnect_jitter_adds_up_to_half() -> None:
    assert reconnect_delay(0, 0.5) == 1.25
    assert reconnect_delay(0, 0.999) < 1.5


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://c1:8470", "ws://c1:8470/ws/peer"),
        ("https://c1.example/", "wss://c1.example/ws/peer"),
        ("http://lb/conveyor", "ws://lb/conveyor/ws/peer"),
        ("ws://c1:8470/ws/peer", "ws://c1:8470/ws/peer"),
    ],
)
def test_peer_socket_urls_follow_the_coordinator_url(url: str, expected: str) -> None:
    assert peer_socket_url(url) == expected


@pytest.mark.parametrize("url", ["ftp://c1", "c1:8470", ""])
def test_a_coordinator_url_that_is_not_http_is_refused(url: str) -> None:
    with pytest.raises(ValueError):
        peer_socket_url(url)


def test_coordinator_health_follows_database_peers_and_lease() -> None:
    assert health_status(database_ok=True, known=2, connected=2, lease_live=True) == "healthy"
    assert health_status(database_ok=True, known=0, connected=0, lease_live=True) == "healthy"
    assert health_status(database_ok=True, known=2, connected=1, lease_live=True) == "degraded"
    assert health_status(database_ok=True, known=0, connected=0, lease_live=False) == "degraded"
    assert health_status(database_ok=False, known=0, connected=0, lease_live=True) == "down"


def test_worker_health_follows_its_coordinators() -> None:
    assert health_status(database_ok=None, known=2, connected=2, lease_live=None) == "healthy"
    assert health_status(database_ok=None, known=2, connected=1, lease_live=None) == "degraded"
    assert health_status(database_ok=None, known=2, connected=0, lease_live=None) == "down"


def beat(instance_id: str = "w1", **extra: object) -> Heartbeat:
    return Heartbeat.model_validate(
        {"instance_id": instance_id, "role": "coordinator", "at": "x", "software_version": "1", **extra}
    )


def test_the_registry_keeps_the_session_role_and_the_last_heartbeat_after_disconnecting() -> None:
    changes: list[tuple[str, str, bool]] = []
    now = [100.0]
    registry = PeerRegistry(clock=lambda: now[0], on_change=lambda *c: changes.append(c))
    registry.connected("w1", "worker")
    registry.heard(beat(cluster_settings_version=4, draining=True), role="worker")
    now[0] = 100.25
    registry.disconnected("w1")
    entry = registry.get("w1")
    assert entry is not None and entry.role == "worker" and not entry.connected
    assert entry.applied_settings_version == 4 and entry.draining and entry.last_heartbeat_at is not None
    assert entry.heartbeat_age_ms(now[0]) == 250
    assert changes == [("w1", "worker", True), ("w1", "worker", False)]


def test_seeded_peers_are_known_but_disconnected_until_they_connect() -> None:
    registry = PeerRegistry()
    registry.seed("c2", "coordinator")
    registry.seed("c2", "coordinator")
    entry = registry.get("c2")
    assert [e.instance_id for e in registry.entries()] == ["c2"]
    assert entry is not None and not entry.connected and entry.heartbeat_age_ms(0) is None
    assert registry.forget("c2") and registry.get("c2") is None


def test_a_peer_that_left_is_disconnected_and_gone_until_it_connects_again() -> None:
    changes: list[tuple[str, str, bool]] = []
    now = [50.0]
    registry = PeerRegistry(clock=lambda: now[0], on_change=lambda *c: changes.append(c))
    registry.connected("w1", "worker")
    registry.left("w1")
    entry = registry.get("w1")
    assert entry is not None and entry.left and not entry.connected and entry.left_monotonic == 50.0
    assert changes == [("w1", "worker", True), ("w1", "worker", False)]
    now[0] = 60.0
    registry.connected("w1", "worker")
    assert not entry.left and entry.left_monotonic is None and entry.connected
    registry.left("unknown")  # a leave from a peer never registered changes nothing
    assert registry.get("unknown") is None
