"""A worker rejects an acceptor that cannot sign with its verifier (docs/design/cluster.md §2.2,
server_signature)."""

import asyncio
import json
from pathlib import Path

import pytest
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from conveyor.cluster.auth import SavedCredential, encode_bytes, save_credential
from conveyor.cluster.channel import AcceptorHandshake
from tests.support.cluster import FAST_CLUSTER, Node
from tests.support.waiting import async_wait_until

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("cluster-processes"), pytest.mark.timeout(120)]


async def test_a_worker_closes_4401_on_an_acceptor_that_cannot_prove_it_holds_the_verifier(
    tmp_path: Path,
) -> None:
    closes: list[int | None] = []

    async def impostor(connection: ServerConnection) -> None:
        """Accepts any proof, as a node without the cluster's database would have to."""
        handshake = AcceptorHandshake()
        await connection.send(json.dumps(handshake.hello()))
        secure = handshake.complete(json.loads(await connection.recv()))
        frame = await connection.recv()
        assert isinstance(frame, bytes) and "proof" in secure.opener.open(frame)
        answer = {
            "type": "peer.auth.response",
            "accepted": True,
            "instance_id": "fake-coordinator",
            "your_role": "worker",
            "server_signature": encode_bytes(b"\x00" * 32),
        }
        await connection.send(secure.sealer.seal(answer))
        try:
            await connection.recv()
        except ConnectionClosed as exc:
            closes.append(exc.rcvd.code if exc.rcvd else None)

    async with serve(impostor, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        home = tmp_path / "w1"
        # A credential from the worker's real cluster, so it authenticates by proof.
        save_credential(home, SavedCredential("w1", encode_bytes(b"s" * 32), "2099-01-01T00:00:00.000Z"))
        worker = await asyncio.to_thread(
            Node,
            "w1",
            home,
            role="worker",
            database_url=None,
            env={**FAST_CLUSTER, "CONVEYOR_INSTANCE_ID": "w1"},
            args=["--role", "worker", "--coordinator", f"http://127.0.0.1:{port}"],
        )
        try:

            async def rejected() -> bool:
                return bool(closes) and "failed to prove it holds our verifier" in worker.output()

            await async_wait_until(rejected, timeout=60, what="the worker to reject the impostor")
            assert closes[0] == 4401
            assert (await asyncio.to_thread(worker.get, "/ready")).status_code == 503
            assert (
                "fake-coordinator" not in worker.output().split("failed to prove")[0].split("connected")[-1]
            )
        finally:
            await asyncio.to_thread(worker.stop)
