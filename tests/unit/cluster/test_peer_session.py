"""One peer session's reader (docs/design/cluster.md §2.1 item 3-4): order, drops, unknown types, replays."""

import asyncio
from typing import Any

from conveyor.cluster.channel import AcceptorHandshake, SecureSession, dialer_handshake
from conveyor.cluster.messages import Heartbeat, PeerMessage
from conveyor.cluster.peer import PeerSession, SocketClosed


class FakeSocket:
    """Frames queued by the test; what the session sends and how it closes are recorded."""

    remote = "127.0.0.1"

    def __init__(self, frames: list[bytes]) -> None:
        self.frames = list(frames)
        self.sent: list[bytes] = []
        self.closed: int | None = None

    async def send_text(self, data: str) -> None:
        raise AssertionError("no text after the handshake")

    async def send_bytes(self, data: bytes) -> None:
        self.sent.append(data)

    async def receive(self) -> str | bytes:
        if not self.frames:
            raise SocketClosed(1000)
        return self.frames.pop(0)

    async def close(self, code: int, reason: str = "") -> None:
        self.closed = code


def sessions() -> tuple[SecureSession, SecureSession]:
    acceptor = AcceptorHandshake()
    response, dialer = dialer_handshake(acceptor.hello())
    return acceptor.complete(response), dialer


def beat(version: int, **extra: Any) -> dict[str, Any]:
    return {
        "type": "peer.heartbeat",
        "instance_id": "w1",
        "role": "worker",
        "at": "x",
        "software_version": "1",
        "cluster_settings_version": version,
        **extra,
    }


async def run(frames: list[bytes], server: SecureSession) -> tuple[int | None, list[PeerMessage], FakeSocket]:
    socket = FakeSocket(frames)
    applied: list[PeerMessage] = []

    async def handle(_: PeerSession, message: PeerMessage) -> None:
        applied.append(message)

    session = PeerSession(socket, server, "w1", "worker", None, "acceptor")
    code = await asyncio.wait_for(session.read(handle), 5)
    return code, applied, socket


async def test_frames_are_applied_in_order_until_the_socket_closes() -> None:
    server, client = sessions()
    code, applied, _ = await run([client.sealer.seal(beat(1)), client.sealer.seal(beat(2))], server)
    assert code == 1000
    assert [m.cluster_settings_version for m in applied if isinstance(m, Heartbeat)] == [1, 2]


async def test_a_replayed_frame_closes_4400_and_nothing_after_it_is_applied() -> None:
    server, client = sessions()
    first = client.sealer.seal(beat(1))
    code, applied, socket = await run([first, first, client.sealer.seal(beat(2))], server)
    assert code == 4400 and socket.closed == 4400
    assert len(applied) == 1


async def test_an_unknown_type_is_ignored_and_the_session_goes_on() -> None:
    server, client = sessions()
    frames = [client.sealer.seal({"type": "peer.future", "x": 1}), client.sealer.seal(beat(3))]
    code, applied, socket = await run(frames, server)
    assert code == 1000 and len(applied) == 1 and socket.closed is None


async def test_an_invalid_request_is_dropped_and_answered_with_peer_error() -> None:
    server, client = sessions()
    invalid = {"type": "peer.heartbeat", "message_id": "m-1", "instance_id": "w1"}
    code, applied, socket = await run([client.sealer.seal(invalid), client.sealer.seal(beat(4))], server)
    assert code == 1000 and len(applied) == 1
    (answer,) = [client.opener.open(frame) for frame in socket.sent]
    assert answer["type"] == "peer.error" and answer["message_id"] == "m-1" and answer["error"] == "invalid"


async def test_a_text_frame_after_the_handshake_closes_4400() -> None:
    server, _ = sessions()
    socket = FakeSocket([])
    socket.frames = ["{}"]  # type: ignore[list-item]
    session = PeerSession(socket, server, "w1", "worker", None, "acceptor")

    async def handle(_: PeerSession, message: PeerMessage) -> None:
        raise AssertionError("nothing may be applied")

    assert await session.read(handle) == 4400
