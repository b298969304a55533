"""Credential rotation (docs/design/cluster.md §2.2): saved and acknowledged first, then one transaction swaps
rows."""

import asyncio
import functools
from typing import Any

import pytest
from sqlalchemy import text

from conveyor.cluster.auth import credential_keys, decode_bytes, load_credential
from conveyor.db.engine import create_sync_engine
from tests.support.cluster import STEADY_PEERS, Cluster, Node, peers_by_id
from tests.support.peer_client import ScriptedPeer
from tests.support.waiting import async_wait_until, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("cluster-processes"), pytest.mark.timeout(300)]


def credential_rows(database_url: str, instance_id: str) -> list[dict[str, Any]]:
    engine = create_sync_engine(database_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT id, stored_key, rotated_at, revoked_at, expires_at - now() AS left_ "
                    "FROM peer_credentials WHERE instance_id = :i ORDER BY created_at"
                ),
                {"i": instance_id},
            )
            return [dict(r._mapping) for r in rows]
    finally:
        engine.dispose()


def age_credential(database_url: str, instance_id: str) -> None:
    """Leave the active credential 10 days to live (inside the 30-day rotation window)."""
    engine = create_sync_engine(database_url)
    try:
        with engine.begin() as conn:
            conn.execute(
                text(
                    "UPDATE peer_credentials SET expires_at = now() + interval '10 days' "
                    "WHERE instance_id = :i AND rotated_at IS NULL"
                ),
                {"i": instance_id},
            )
    finally:
        engine.dispose()


async def joined_near_expiry(cluster: Cluster, via: Node, instance_id: str) -> bytes:
    """Join `instance_id` through `via` as a scripted peer; its credential then has 10 days left."""
    token = await asyncio.to_thread(cluster.join_token, via)
    joiner = await ScriptedPeer.connect(via.url)
    secret = decode_bytes((await joiner.join(instance_id, token))["credential"]["secret"])
    assert secret is not None
    await joiner.close()
    await asyncio.to_thread(age_credential, cluster.database_url or "", instance_id)
    return secret


async def test_a_credential_near_expiry_is_rotated_only_after_the_peer_acknowledges(
    pg_cluster: Cluster,
) -> None:
    # The scripted peer sends no heartbeats: a 5 s stale window keeps a loaded box's slow rotation from
    # dropping it first (rotation is what this test is about, not liveness).
    c1 = await asyncio.to_thread(functools.partial(pg_cluster.coordinator, "c1", **STEADY_PEERS))
    url = pg_cluster.database_url or ""
    old_secret = await joined_near_expiry(pg_cluster, c1, "w-rot")

    peer = await ScriptedPeer.connect(c1.url)
    assert (await peer.prove("w-rot", old_secret))["accepted"] is True
    rotate = await peer.receive_type("peer.credential.rotate")
    new_secret = decode_bytes(rotate["secret"])
    assert new_secret is not None and new_secret != old_secret
    before = await asyncio.to_thread(credential_rows, url, "w-rot")
    assert [r["rotated_at"] for r in before] == [None]  # nothing changes before the ack

    await peer.send({"type": "peer.credential.rotate.ack", "instance_id": "w-rot"})

    async def swapped() -> bool:
        rows = await asyncio.to_thread(credential_rows, url, "w-rot")
        return len(rows) == 2 and rows[0]["rotated_at"] is not None and rows[1]["rotated_at"] is None

    await async_wait_until(swapped, what="the rotated row")
    rows = await asyncio.to_thread(credential_rows, url, "w-rot")
    assert bytes(rows[1]["stored_key"]) == credential_keys(new_secret, "w-rot").stored_key
    assert rows[1]["left_"].days >= 89
    # The session opened with the rotated row stays up.
    await peer.send(
        {
            "type": "peer.heartbeat",
            "instance_id": "w-rot",
            "role": "worker",
            "at": "x",
            "software_version": "t",
            "cluster_settings_version": 8,
        }
    )
    await async_wait_until(
        lambda: asyncio.to_thread(
            lambda: peers_by_id(c1, pg_cluster.token)["w-rot"]["applied_settings_version"] == 8
        ),
        what="the old session still applies frames",
    )
    stale = await ScriptedPeer.connect(c1.url)
    assert (await stale.prove("w-rot", old_secret))["reason"] == "proof_invalid"
    fresh = await ScriptedPeer.connect(c1.url)
    assert (await fresh.prove("w-rot", new_secret))["accepted"] is True
    await fresh.close()
    await peer.close()


def test_a_worker_saves_a_rotated_credential_and_keeps_working_with_it(pg_cluster: Cluster) -> None:
    c1 = pg_cluster.coordinator("c1")
    url = pg_cluster.database_url or ""
    worker = pg_cluster.worker("w1", [c1], join_token=pg_cluster.join_token(c1), via_proxy=True)
    wait_until(lambda: peers_by_id(c1, pg_cluster.token).get("w1", {}).get("connected"), what="w1 joined")
    first = load_credential(worker.home, "w1")
    assert first is not None
    age_credential(url, "w1")
    pg_cluster.cut_link(worker, c1)  # reconnecting makes the coordinator look at the expiry
    wait_until(lambda: peers_by_id(c1, pg_cluster.token)["w1"]["connected"] is False, what="w1 cut off")
    pg_cluster.restore_link(worker, c1)
    wait_until(lambda: len(credential_rows(url, "w1")) == 2, timeout=30, what="the credential rotated")
    rotated = load_credential(worker.home, "w1")
    assert rotated is not None and rotated.secret != first.secret
    active = [r for r in credential_rows(url, "w1") if r["rotated_at"] is None]
    assert [bytes(r["stored_key"]) for r in active] == [
        credential_keys(rotated.secret_bytes, "w1").stored_key
    ]
    # And the next connection proves with the new secret (the old one is then forgotten).
    pg_cluster.cut_link(worker, c1)
    pg_cluster.restore_link(worker, c1)
    wait_until(lambda: peers_by_id(c1, pg_cluster.token)["w1"]["connected"], timeout=30, what="w1 back")
    wait_until(lambda: load_credential(worker.home, "w1").previous_secret is None, what="old secret dropped")  # type: ignore[union-attr]
    assert len(credential_rows(url, "w1")) == 2


async def test_a_peer_that_proved_between_leaders_is_offered_rotation_once_its_coordinator_leads(
    pg_cluster: Cluster,
) -> None:
    # Rotation is the leader's to offer. A peer that proved to c2 while c1 led would otherwise wait for
    # c2's next revocation check (every 60 s here) after c2 took the lease over.
    c1 = await asyncio.to_thread(functools.partial(pg_cluster.coordinator, "c1", **STEADY_PEERS))
    c2 = await asyncio.to_thread(functools.partial(pg_cluster.coordinator, "c2", **STEADY_PEERS))
    old_secret = await joined_near_expiry(pg_cluster, c1, "w-gap")

    peer = await ScriptedPeer.connect(c2.url)
    assert (await peer.prove("w-gap", old_secret))["accepted"] is True
    beating = asyncio.create_task(heartbeats(peer, "w-gap"))  # stays live however long the takeover takes
    try:
        await asyncio.to_thread(c1.stop)  # c2 takes the lease over
        rotate = await peer.receive_type("peer.credential.rotate", timeout=20)
    finally:
        beating.cancel()
    new_secret = decode_bytes(rotate["secret"])
    assert new_secret is not None and new_secret != old_secret
    await peer.close()


async def heartbeats(peer: ScriptedPeer, instance_id: str) -> None:
    """What a worker sends while connected, every 200 ms (the clusters' heartbeat interval in tests)."""
    while True:
        await peer.send(
            {
                "type": "peer.heartbeat",
                "instance_id": instance_id,
                "role": "worker",
                "at": "x",
                "software_version": "t",
                "cluster_settings_version": 0,
            }
        )
        await asyncio.sleep(0.2)
