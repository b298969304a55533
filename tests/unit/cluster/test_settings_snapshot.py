"""Worker settings snapshots (docs/design/cluster.md §5.3): when a worker pulls, what it adopts, what it
applies."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from conveyor.cluster.messages import Heartbeat, PeerError, PeerMessage, SettingsRequest, SettingsResponse
from conveyor.cluster.peer import PeerSession
from conveyor.cluster.service import PeerUnavailable
from conveyor.cluster.snapshot import (
    SETTINGS_SNAPSHOT,
    PullDecision,
    SettingsPuller,
    WorkerSettingsSnapshot,
    adopts_served_snapshot,
    decide_settings_pull,
    settings_check,
    settings_request_handler,
    snapshot_defaults,
    snapshot_settings,
)
from conveyor.model.knobs import CLUSTER_KNOBS_BY_NAME, WORKER_SNAPSHOT_KNOBS
from conveyor.parts import Parts
from conveyor.runtime.settings import ClusterSettingsView, cluster_view
from conveyor.runtime.store import StoredSettings

DEFAULTS = {name: CLUSTER_KNOBS_BY_NAME[name].default or 0 for name in WORKER_SNAPSHOT_KNOBS}


# --- decide_settings_pull: every branch


@pytest.mark.parametrize("in_flight", [False, True])
@pytest.mark.parametrize("lower_beats", [0, 1, 2])
def test_an_equal_version_never_pulls_and_resets_the_lower_beat_count(
    lower_beats: int, in_flight: bool
) -> None:
    decision = decide_settings_pull(
        applied=4, advertised=4, lower_beats=lower_beats, pull_in_flight=in_flight
    )
    assert decision == PullDecision(False, None, 0)


@pytest.mark.parametrize("lower_beats", [0, 2])
def test_a_higher_version_pulls_at_once_and_resets_the_count(lower_beats: int) -> None:
    decision = decide_settings_pull(applied=4, advertised=5, lower_beats=lower_beats, pull_in_flight=False)
    assert decision == PullDecision(True, "newer", 0)


def test_a_higher_version_waits_while_a_pull_is_in_flight() -> None:
    decision = decide_settings_pull(applied=0, advertised=9, lower_beats=0, pull_in_flight=True)
    assert decision == PullDecision(False, None, 0)


def test_a_lower_version_counts_beats_and_pulls_once_at_the_third() -> None:
    first = decide_settings_pull(applied=7, advertised=5, lower_beats=0, pull_in_flight=False)
    second = decide_settings_pull(
        applied=7, advertised=5, lower_beats=first.lower_beats, pull_in_flight=False
    )
    third = decide_settings_pull(
        applied=7, advertised=5, lower_beats=second.lower_beats, pull_in_flight=False
    )
    assert (first, second) == (PullDecision(False, None, 1), PullDecision(False, None, 2))
    assert third == PullDecision(True, "restored", 0)


def test_a_lower_version_does_not_pull_while_one_is_in_flight_and_pulls_at_the_next_free_beat() -> None:
    held = decide_settings_pull(applied=7, advertised=5, lower_beats=2, pull_in_flight=True)
    assert held == PullDecision(False, None, 3)
    assert decide_settings_pull(applied=7, advertised=5, lower_beats=3, pull_in_flight=True).lower_beats == 3
    assert decide_settings_pull(applied=7, advertised=5, lower_beats=3, pull_in_flight=False) == PullDecision(
        True, "restored", 0
    )


def test_the_self_heal_threshold_is_a_parameter() -> None:
    assert decide_settings_pull(
        applied=2, advertised=1, lower_beats=0, pull_in_flight=False, self_heal_beats=1
    ) == PullDecision(True, "restored", 0)


def test_an_interrupted_run_of_lower_beats_starts_over() -> None:
    counted = decide_settings_pull(applied=7, advertised=5, lower_beats=0, pull_in_flight=False)
    reset = decide_settings_pull(
        applied=7, advertised=7, lower_beats=counted.lower_beats, pull_in_flight=False
    )
    again = decide_settings_pull(applied=7, advertised=5, lower_beats=reset.lower_beats, pull_in_flight=False)
    assert again == PullDecision(False, None, 1)


@pytest.mark.parametrize(
    ("applied", "served", "reason", "adopted"),
    [
        (4, 5, "newer", True),
        (4, 4, "newer", False),
        (4, 3, "newer", False),
        (7, 5, "restored", True),
        (7, 7, "restored", True),
        (0, 0, "restored", True),
    ],
)
def test_only_a_self_heal_adopts_a_version_that_is_not_higher(
    applied: int, served: int, reason: Any, adopted: bool
) -> None:
    assert adopts_served_snapshot(applied=applied, served=served, reason=reason) is adopted


# --- the snapshot a worker applies


def test_before_the_first_pull_the_snapshot_is_version_0_with_the_env_defaults() -> None:
    defaults = snapshot_defaults(lambda name: 120_000 if name == "agent_token_ttl_ms" else None)
    snapshot = WorkerSettingsSnapshot(defaults)
    assert snapshot.version == 0
    assert snapshot.current().agent_token_ttl_ms == 120_000
    assert snapshot.value("firecracker_api_socket_wait_ms") == 5000
    assert set(snapshot.current().settings) == set(WORKER_SNAPSHOT_KNOBS)


def test_applying_swaps_the_whole_snapshot_and_a_missing_or_null_field_keeps_the_local_default() -> None:
    snapshot = WorkerSettingsSnapshot(DEFAULTS)
    before = snapshot.current()
    applied = snapshot.apply(
        3, {"agent_token_ttl_ms": 90_000, "firecracker_api_socket_wait_ms": None, "unknown_knob": 1}, "c1"
    )
    assert snapshot.current() is applied and applied.version == 3 and applied.served_by == "c1"
    assert applied.agent_token_ttl_ms == 90_000
    assert applied.firecracker_api_socket_wait_ms == DEFAULTS["firecracker_api_socket_wait_ms"]
    assert "unknown_knob" not in applied.settings
    # The snapshot a spawn read before the swap is untouched (no mix of two versions).
    assert before.version == 0 and before.agent_token_ttl_ms == DEFAULTS["agent_token_ttl_ms"]
    with pytest.raises(TypeError):
        applied.settings["agent_token_ttl_ms"] = 1  # type: ignore[index]


def test_a_snapshot_needs_a_default_for_every_knob() -> None:
    with pytest.raises(ValueError, match="agent_token_ttl_ms"):
        WorkerSettingsSnapshot({k: v for k, v in DEFAULTS.items() if k != "agent_token_ttl_ms"})


def test_the_ready_check_names_the_version_and_values() -> None:
    snapshot = WorkerSettingsSnapshot(DEFAULTS)
    snapshot.apply(2, {"agent_token_ttl_ms": 61_000}, "c1")
    parts = Parts()
    parts.put(SETTINGS_SNAPSHOT, snapshot)
    check = settings_check(parts)
    assert check["ok"] is True and check["version"] == 2
    assert cast(dict[str, int], check["values"])["agent_token_ttl_ms"] == 61_000
    assert "served by c1" in str(check["detail"])
    assert settings_check(Parts())["ok"] is False


# --- the coordinator's answer


def test_the_served_settings_are_the_snapshot_knobs_of_one_view_with_defaults_for_nulls() -> None:
    stored = dict.fromkeys(CLUSTER_KNOBS_BY_NAME, None) | {"agent_token_ttl_ms": 70_000, "queue_max_depth": 5}
    row = StoredSettings(version=6, values=stored, updated_at=None, updated_by=None)
    defaults = {name: knob.default for name, knob in CLUSTER_KNOBS_BY_NAME.items()}
    defaults["scaler_reap_interval_ms"] = 10_000
    served = snapshot_settings(cluster_view(row, defaults))
    assert set(served) == set(WORKER_SNAPSHOT_KNOBS)
    assert served["agent_token_ttl_ms"] == 70_000 and served["scaler_reap_interval_ms"] == 10_000


class FakeSession:
    """What handlers and the puller use of a peer session."""

    def __init__(self, peer_id: str = "c1", peer_role: str = "coordinator") -> None:
        self.peer_id = peer_id
        self.peer_role = peer_role
        self.sent: list[Any] = []

    async def send(self, message: Any) -> None:
        self.sent.append(message)


async def test_the_coordinator_answers_a_request_with_the_version_and_values_of_one_read() -> None:
    reads = 0

    async def read() -> ClusterSettingsView:
        nonlocal reads
        reads += 1
        return cluster_view(
            StoredSettings(
                version=9,
                values=dict.fromkeys(CLUSTER_KNOBS_BY_NAME, None) | {"agent_token_ttl_ms": 600_000},
                updated_at=None,
                updated_by=None,
            ),
            {name: knob.default for name, knob in CLUSTER_KNOBS_BY_NAME.items()},
        )

    session = FakeSession(peer_id="w1", peer_role="worker")
    reply = await settings_request_handler(read)(cast(PeerSession, session), SettingsRequest(message_id="m1"))
    assert reads == 1
    assert isinstance(reply, SettingsResponse) and reply.message_id == "m1" and reply.version == 9
    assert reply.settings["agent_token_ttl_ms"] == 600_000


async def test_an_unreadable_row_is_answered_with_a_peer_error() -> None:
    async def read() -> ClusterSettingsView:
        raise OSError("database down")

    session = FakeSession(peer_id="w1", peer_role="worker")
    reply = await settings_request_handler(read)(cast(PeerSession, session), SettingsRequest(message_id="m2"))
    assert isinstance(reply, PeerError) and reply.message_id == "m2" and reply.error == "unavailable"


# --- the worker's puller


def beat(version: int, peer: str = "c1") -> Heartbeat:
    return Heartbeat(
        instance_id=peer, role="coordinator", at="x", software_version="1", cluster_settings_version=version
    )


class ScriptedCoordinator:
    """Answers each pull with the next scripted reply (a response, an error or an exception)."""

    def __init__(self, *replies: Any) -> None:
        self.replies = list(replies)
        self.asked: list[tuple[str, PeerMessage, float]] = []
        self.release = asyncio.Event()
        self.release.set()

    async def ask(self, peer: str, message: PeerMessage, timeout_s: float) -> PeerMessage:
        self.asked.append((peer, message, timeout_s))
        await self.release.wait()
        reply = self.replies.pop(0)
        if isinstance(reply, Exception):
            raise reply
        if isinstance(reply, SettingsResponse | PeerError):
            return reply.model_copy(update={"message_id": getattr(message, "message_id", None)})
        raise AssertionError(reply)


def response(version: int, ttl: int) -> SettingsResponse:
    return SettingsResponse(message_id="x", version=version, settings={"agent_token_ttl_ms": ttl})


async def settle(puller: SettingsPuller) -> None:
    if puller._pulling is not None:
        await puller._pulling


async def test_a_higher_advertised_version_is_pulled_applied_and_then_advertised() -> None:
    coordinator = ScriptedCoordinator(response(2, 90_000))
    snapshot = WorkerSettingsSnapshot(DEFAULTS)
    puller = SettingsPuller(snapshot, ask=coordinator.ask)
    session = cast(PeerSession, FakeSession())
    puller.observe(session, beat(2))
    await settle(puller)
    assert snapshot.version == 2 and snapshot.current().agent_token_ttl_ms == 90_000
    ((_, request, timeout_s),) = coordinator.asked
    assert isinstance(request, SettingsRequest) and timeout_s == 10.0
    puller.observe(session, beat(2))
    assert not puller.pull_in_flight and len(coordinator.asked) == 1


async def test_one_pull_in_flight_at_a_time() -> None:
    coordinator = ScriptedCoordinator(response(3, 90_000))
    coordinator.release.clear()
    snapshot = WorkerSettingsSnapshot(DEFAULTS)
    puller = SettingsPuller(snapshot, ask=coordinator.ask)
    puller.observe(cast(PeerSession, FakeSession("c1")), beat(3, "c1"))
    await asyncio.sleep(0)  # let the pull send its request
    puller.observe(cast(PeerSession, FakeSession("c2")), beat(3, "c2"))
    assert len(coordinator.asked) == 1 and puller.pull_in_flight
    coordinator.release.set()
    await settle(puller)
    assert snapshot.version == 3


@pytest.mark.parametrize(
    "failure",
    [TimeoutError(), PeerUnavailable("c1"), PeerError(message_id="x", error="unavailable", detail="db")],
)
async def test_a_failed_pull_keeps_the_snapshot_and_is_retried_at_the_next_beat(failure: Any) -> None:
    coordinator = ScriptedCoordinator(failure, response(4, 80_000))
    snapshot = WorkerSettingsSnapshot(DEFAULTS)
    puller = SettingsPuller(snapshot, ask=coordinator.ask)
    session = cast(PeerSession, FakeSession())
    puller.observe(session, beat(4))
    await settle(puller)
    assert snapshot.version == 0
    puller.observe(session, beat(4))
    await settle(puller)
    assert snapshot.version == 4 and len(coordinator.asked) == 2


async def test_a_restored_row_is_adopted_after_three_lower_beats() -> None:
    coordinator = ScriptedCoordinator(response(7, 90_000), response(5, 70_000))
    snapshot = WorkerSettingsSnapshot(DEFAULTS)
    puller = SettingsPuller(snapshot, ask=coordinator.ask)
    session = cast(PeerSession, FakeSession())
    puller.observe(session, beat(7))
    await settle(puller)
    for _ in range(2):
        puller.observe(session, beat(5))
        assert not puller.pull_in_flight
    puller.observe(session, beat(5))
    await settle(puller)
    assert snapshot.version == 5 and snapshot.current().agent_token_ttl_ms == 70_000
    assert len(coordinator.asked) == 2


async def test_a_newer_pull_served_an_older_version_keeps_the_applied_one() -> None:
    coordinator = ScriptedCoordinator(response(3, 70_000))
    snapshot = WorkerSettingsSnapshot(DEFAULTS)
    snapshot.apply(4, {"agent_token_ttl_ms": 90_000})
    puller = SettingsPuller(snapshot, ask=coordinator.ask)
    assert await puller.pull("c1", "newer") is None
    assert snapshot.version == 4 and snapshot.current().agent_token_ttl_ms == 90_000


async def test_heartbeats_from_a_non_coordinator_are_ignored() -> None:
    coordinator = ScriptedCoordinator()
    puller = SettingsPuller(WorkerSettingsSnapshot(DEFAULTS), ask=coordinator.ask)
    puller.observe(cast(PeerSession, FakeSession("w2", "worker")), beat(9, "w2"))
    assert not puller.pull_in_flight and coordinator.asked == []
