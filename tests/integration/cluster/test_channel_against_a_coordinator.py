"""The channel's rules held by a real coordinator (scenarios 3 and 5, close codes)."""

import asyncio

import pytest
from sqlalchemy import select, update
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from conveyor.cluster.auth import decode_bytes
from conveyor.cluster.service import peer_socket_url
from conveyor.db.engine import create_sync_engine
from conveyor.db.tables import peer_credentials
from conveyor.model import protocol as p
from conveyor.model.ids import format_rfc3339, utc_now
from tests.support.cluster import Cluster, Node, peers_by_id
from tests.support.peer_client import ScriptedPeer
from tests.support.protocol_agent import ScriptedAgent
from tests.support.waiting import async_wait_until

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("cluster-processes"), pytest.mark.timeout(300)]

# A scripted peer beats only when a test sends one, and a test's waits (API polls) can outlast the
# cluster tests' 600 ms stale window on a busy machine: the coordinator would close the session as
# stale before the frame under test arrives. These tests are about frames, not liveness.
SILENT_PEER = {"CONVEYOR_CLUSTER_HEARTBEAT_INTERVAL_MS": "5000"}


def beat(instance_id: str, version: int) -> dict[str, object]:
    return {
        "type": "peer.heartbeat",
        "instance_id": instance_id,
        "role": "worker",
        "at": format_rfc3339(utc_now()),
        "software_version": "test",
        "cluster_settings_version": version,
    }


async def joined(cluster: Cluster, node: Node, instance_id: str) -> tuple[ScriptedPeer, bytes]:
    token = await asyncio.to_thread(cluster.join_token, node)
    peer = await ScriptedPeer.connect(node.url)
    answer = await peer.join(instance_id, token)
    assert answer["accepted"] is True and answer["your_role"] == "worker", answer
    secret = decode_bytes(answer["credential"]["secret"])
    assert secret is not None
    return peer, secret


async def applied_version(cluster: Cluster, node: Node, instance_id: str) -> int:
    peers = await asyncio.to_thread(peers_by_id, node, cluster.token)
    return int(peers[instance_id]["applied_settings_version"])


async def version_is(cluster: Cluster, node: Node, instance_id: str, expected: int) -> bool:
    return await applied_version(cluster, node, instance_id) == expected


async def test_a_replayed_frame_closes_4400_and_is_not_applied(pg_cluster: Cluster) -> None:
    c1 = await asyncio.to_thread(pg_cluster.coordinator, "c1", **SILENT_PEER)
    peer, _ = await joined(pg_cluster, c1, "w-replay")
    first = peer.seal(beat("w-replay", 5))
    await peer.send_frame(first)
    await async_wait_until(lambda: version_is(pg_cluster, c1, "w-replay", 5), what="version 5 applied")
    await peer.send(beat("w-replay", 6))
    await async_wait_until(lambda: version_is(pg_cluster, c1, "w-replay", 6), what="version 6 applied")
    await peer.send_frame(first)  # the captured frame again: would set the version back to 5
    assert await peer.closed_with() == 4400
    assert await applied_version(pg_cluster, c1, "w-replay") == 6


async def test_a_skipped_sequence_number_closes_4400_and_is_not_applied(pg_cluster: Cluster) -> None:
    c1 = await asyncio.to_thread(pg_cluster.coordinator, "c1", **SILENT_PEER)
    peer, _ = await joined(pg_cluster, c1, "w-gap")
    await peer.send(beat("w-gap", 5))
    await async_wait_until(lambda: version_is(pg_cluster, c1, "w-gap", 5), what="version 5 applied")
    peer.seal(beat("w-gap", 6))  # sealed but never sent: the next frame skips a seq
    await peer.send(beat("w-gap", 7))
    assert await peer.closed_with() == 4400
    assert await applied_version(pg_cluster, c1, "w-gap") == 5


async def test_a_tampered_frame_closes_4400(pg_cluster: Cluster) -> None:
    c1 = await asyncio.to_thread(pg_cluster.coordinator, "c1", **SILENT_PEER)
    peer, _ = await joined(pg_cluster, c1, "w-tamper")
    frame = bytearray(peer.seal(beat("w-tamper", 9)))
    frame[-1] ^= 1
    await peer.send_frame(bytes(frame))
    assert await peer.closed_with() == 4400


async def test_an_unsupported_protocol_version_closes_4400(pg_cluster: Cluster) -> None:
    c1 = await asyncio.to_thread(pg_cluster.coordinator, "c1", **SILENT_PEER)
    async with connect(peer_socket_url(c1.url)) as connection:
        await connection.recv()
        await connection.send('{"type": "peer.hello.response", "protocol_version": 99}')
        with pytest.raises(ConnectionClosed) as closed:
            await connection.recv()
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 4400


async def test_proofs_from_a_leaked_verifier_fail_and_the_real_secret_succeeds_as_worker(
    pg_cluster: Cluster,
) -> None:
    c1 = await asyncio.to_thread(pg_cluster.coordinator, "c1", **SILENT_PEER)
    peer, secret = await joined(pg_cluster, c1, "w-leak")
    await peer.close()
    engine = create_sync_engine(pg_cluster.database_url or "")
    try:
        with engine.connect() as conn:
            row = conn.execute(
                select(peer_credentials).where(peer_credentials.c.instance_id == "w-leak")
            ).one()
    finally:
        engine.dispose()
    for leaked in (bytes(row.stored_key), bytes(row.server_key)):
        attacker = await ScriptedPeer.connect(c1.url)
        answer = await attacker.prove("w-leak", b"\x00" * 32, client_key=leaked)
        assert (answer["accepted"], answer["reason"]) == (False, "proof_invalid")
        assert await attacker.closed_with() == 4401
    real = await ScriptedPeer.connect(c1.url)
    answer = await real.prove("w-leak", secret)
    assert answer["accepted"] is True and answer["your_role"] == "worker" and answer["server_signature"]
    await real.send(beat("w-leak", 1))
    peers = await asyncio.to_thread(peers_by_id, c1, pg_cluster.token)
    assert peers["w-leak"]["role"] == "worker" and peers["w-leak"]["connected"] is True
    await real.close()


async def test_a_peer_that_does_not_authenticate_in_time_is_closed_4408(pg_cluster: Cluster) -> None:
    c1 = await asyncio.to_thread(pg_cluster.coordinator, "c1", CONVEYOR_TEST_PEER_AUTH_TIMEOUT_MS="500")
    silent = await ScriptedPeer.connect(c1.url)
    assert await silent.closed_with() == 4408


async def test_a_second_session_for_an_instance_replaces_the_first_with_4409(pg_cluster: Cluster) -> None:
    c1 = await asyncio.to_thread(pg_cluster.coordinator, "c1", **SILENT_PEER)
    first, secret = await joined(pg_cluster, c1, "w-twice")
    second = await ScriptedPeer.connect(c1.url)
    assert (await second.prove("w-twice", secret))["accepted"] is True
    assert await first.closed_with() == 4409
    await second.send(beat("w-twice", 3))
    await async_wait_until(lambda: version_is(pg_cluster, c1, "w-twice", 3), what="the new session applies")
    await second.close()


async def test_a_used_join_token_replayed_under_a_live_workers_id_is_refused_and_the_worker_stays(
    pg_cluster: Cluster,
) -> None:
    c1 = await asyncio.to_thread(pg_cluster.coordinator, "c1", **SILENT_PEER)
    token = await asyncio.to_thread(pg_cluster.join_token, c1)
    worker = await ScriptedPeer.connect(c1.url)
    assert (await worker.join("w-live", token))["accepted"] is True
    impostor = await ScriptedPeer.connect(c1.url)
    answer = await impostor.join("w-live", token)
    assert (answer["accepted"], answer["reason"], answer.get("credential")) == (False, "token_used", None)
    assert await impostor.closed_with() == 4401
    await worker.send(beat("w-live", 4))  # the real worker's session was neither replaced nor retired
    await async_wait_until(lambda: version_is(pg_cluster, c1, "w-live", 4), what="the worker still applies")
    await worker.close()


async def test_the_sixth_failure_within_a_minute_is_throttled_with_4429(pg_cluster: Cluster) -> None:
    c1 = await asyncio.to_thread(pg_cluster.coordinator, "c1", **SILENT_PEER)
    peer, secret = await joined(pg_cluster, c1, "w-throttle")
    await peer.close()
    for _ in range(5):
        guesser = await ScriptedPeer.connect(c1.url)
        assert (await guesser.prove("w-throttle", b"\x01" * 32))["reason"] == "proof_invalid"
        assert await guesser.closed_with() == 4401
    real = await ScriptedPeer.connect(c1.url)
    answer = await real.prove("w-throttle", secret)
    assert (answer["accepted"], answer["reason"]) == (False, "throttled")
    assert await real.closed_with() == 4429
    metrics = (await asyncio.to_thread(c1.get, "/metrics")).text
    assert 'conveyor_peer_auth_failures_total{reason="proof_invalid"} 5.0' in metrics
    assert 'conveyor_peer_auth_failures_total{reason="throttled"} 1.0' in metrics


async def test_the_backstop_closes_a_session_whose_credential_was_revoked_behind_its_back(
    pg_cluster: Cluster,
) -> None:
    c1 = await asyncio.to_thread(
        pg_cluster.coordinator, "c1", CONVEYOR_TEST_PEER_REVOCATION_CHECK_MS="200", **SILENT_PEER
    )
    peer, _ = await joined(pg_cluster, c1, "w-backstop")
    metrics = (await asyncio.to_thread(c1.get, "/metrics")).text
    assert 'conveyor_peer_connected{peer="w-backstop",role="worker"} 1.0' in metrics
    engine = create_sync_engine(pg_cluster.database_url or "")
    try:
        with engine.begin() as conn:  # as another coordinator's revoke would, without telling this one
            conn.execute(update(peer_credentials).values(revoked_at=utc_now()))
    finally:
        engine.dispose()
    assert await peer.closed_with() == 4403


async def test_a_coordinator_heartbeats_right_after_auth_with_its_lease_and_key_fingerprint(
    pg_cluster: Cluster,
) -> None:
    c1 = await asyncio.to_thread(pg_cluster.coordinator, "c1")  # its beats every 200 ms are the subject
    peer, _ = await joined(pg_cluster, c1, "w-hb")
    first = await peer.receive_type("peer.heartbeat", timeout=5)
    assert first["instance_id"] == "c1" and first["role"] == "coordinator"
    assert first["lease"]["holder"] == "c1" and first["lease"]["epoch"] >= 1
    assert first["secret_key_fingerprint"] and first["cluster_settings_version"] >= 0
    second = await peer.receive_type("peer.heartbeat", timeout=5)  # then every interval
    assert second["at"] >= first["at"]
    await peer.close()


async def test_a_coordinators_heartbeat_lists_its_connected_agents(pg_cluster: Cluster) -> None:
    c1 = await asyncio.to_thread(pg_cluster.coordinator, "c1", **SILENT_PEER)
    minted = await asyncio.to_thread(
        c1.post, "/api/v1/admin/agent-tokens", pg_cluster.token, {"labels": ["linux", "GPU"]}
    )
    assert minted.status_code == 201, minted.text
    agent = ScriptedAgent(
        c1.url.replace("http://", "ws://") + "/ws",
        minted.json()["token"],
        labels=["linux", "GPU"],
        capacity=3,
    )
    await agent.connect()
    peer, _ = await joined(pg_cluster, c1, "w-inventory")
    try:

        async def listed() -> dict[str, object] | None:
            heartbeat = await peer.receive_type("peer.heartbeat", timeout=5)
            return heartbeat if heartbeat["agents"] else None

        heartbeat = await async_wait_until(listed, timeout=30, what="a heartbeat listing the agent")
        [entry] = heartbeat["agents"]  # type: ignore[misc]
        assert entry["agent_id"] == agent.agent_id
        assert entry["capacity"] == 3 and entry["active_jobs"] == 0
        assert "gpu" in entry["labels"], "labels are lower-cased"
        assert heartbeat["scalers"] == []
    finally:
        await peer.close()
        await agent.close()


async def test_a_workers_agent_token_revoke_is_ignored(pg_cluster: Cluster) -> None:
    # Only coordinators share the agent tokens' table: a worker may not close anyone's agents.
    c1 = await asyncio.to_thread(pg_cluster.coordinator, "c1", **SILENT_PEER)
    minted = await asyncio.to_thread(
        c1.post, "/api/v1/admin/agent-tokens", pg_cluster.token, {"labels": ["linux"]}
    )
    assert minted.status_code == 201, minted.text
    agent = ScriptedAgent(c1.url.replace("http://", "ws://") + "/ws", minted.json()["token"])
    await agent.connect()
    peer, _ = await joined(pg_cluster, c1, "w-kicker")
    try:
        await peer.send({"type": "agent_token.revoke", "token_id": minted.json()["id"]})
        # A frame behind it applied: the notice was read (and ignored) before it.
        await peer.send(beat("w-kicker", 3))
        await async_wait_until(lambda: version_is(pg_cluster, c1, "w-kicker", 3), what="version 3 applied")
        await agent.send(p.Heartbeat(ts=0.0, running=[], free_slots=1))
        assert isinstance(await agent.next_of(p.HeartbeatAck, timeout=30), p.HeartbeatAck)
        assert agent.close_code is None
    finally:
        await peer.close()
        await agent.close()
