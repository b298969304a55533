"""The peer channel's handshake and frames (docs/design/cluster.md §2.1): keys, transcript, strict
sequencing."""

import base64
import hashlib
import json

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from conveyor.cluster.channel import (
    AcceptorHandshake,
    FrameOpener,
    FrameSealer,
    ProtocolViolation,
    SecureSession,
    derive_session_keys,
    dialer_handshake,
    parse_plaintext,
    public_bytes,
    transcript_hash,
)

KEY = bytes(range(32))


def handshake() -> tuple[SecureSession, SecureSession]:
    acceptor = AcceptorHandshake()
    response, dialer = dialer_handshake(acceptor.hello())
    return acceptor.complete(response), dialer


def test_both_ends_derive_the_same_transcript_and_talk_both_ways() -> None:
    server, client = handshake()
    assert server.th == client.th and len(server.th) == 32
    assert server.opener.open(client.sealer.seal({"type": "peer.heartbeat", "n": 1})) == {
        "type": "peer.heartbeat",
        "n": 1,
    }
    assert client.opener.open(server.sealer.seal({"type": "x", "n": 2})) == {"type": "x", "n": 2}


def test_keys_follow_the_documented_hkdf_and_transcript() -> None:
    server_key, client_key = X25519PrivateKey.generate(), X25519PrivateKey.generate()
    pub_s, pub_c = public_bytes(server_key), public_bytes(client_key)
    nonce_s, nonce_c = b"s" * 32, b"c" * 32
    keys = derive_session_keys(server_key, pub_c, pub_s=pub_s, pub_c=pub_c, nonce_s=nonce_s, nonce_c=nonce_c)
    z = client_key.exchange(server_key.public_key())

    def hkdf(info: bytes) -> bytes:
        return HKDF(algorithm=hashes.SHA256(), length=32, salt=nonce_s + nonce_c, info=info).derive(z)

    assert keys.k_c2s == hkdf(b"conveyor-peer-v1 c2s")
    assert keys.k_s2c == hkdf(b"conveyor-peer-v1 s2c")
    assert keys.k_c2s != keys.k_s2c
    assert keys.th == hashlib.sha256(b"conveyor-peer-v1" + pub_s + pub_c + nonce_s + nonce_c).digest()
    assert transcript_hash(pub_s, pub_c, nonce_s, nonce_c) == keys.th


def test_frame_layout_is_seq_then_gcm_with_the_documented_nonce_and_aad() -> None:
    frame = FrameSealer(KEY, "c2s").seal({"a": 1})
    assert frame[:8] == (1).to_bytes(8, "big")
    nonce = b"\x00" * 4 + frame[:8]
    plaintext = AESGCM(KEY).decrypt(nonce, frame[8:], b"conveyor-peer-v1 c2s" + frame[:8])
    assert json.loads(plaintext) == {"a": 1}


def test_sequence_numbers_start_at_one_and_count_up() -> None:
    sealer = FrameSealer(KEY, "s2c")
    seqs = [int.from_bytes(sealer.seal({"i": i})[:8], "big") for i in range(3)]
    assert seqs == [1, 2, 3]


def test_a_replayed_frame_is_refused_and_changes_nothing() -> None:
    sealer, opener = FrameSealer(KEY, "c2s"), FrameOpener(KEY, "c2s")
    first = sealer.seal({"i": 1})
    opener.open(first)
    with pytest.raises(ProtocolViolation, match="repeated or reordered sequence number: got 1, expected 2"):
        opener.open(first)
    assert opener.last_seq == 1
    assert opener.open(sealer.seal({"i": 2})) == {"i": 2}


def test_a_skipped_sequence_number_is_refused() -> None:
    sealer, opener = FrameSealer(KEY, "c2s"), FrameOpener(KEY, "c2s")
    sealer.seal({"i": 1})  # lost
    with pytest.raises(ProtocolViolation, match="skipped sequence number: got 2, expected 1"):
        opener.open(sealer.seal({"i": 2}))
    assert opener.last_seq == 0


def test_reordered_frames_are_refused() -> None:
    sealer, opener = FrameSealer(KEY, "c2s"), FrameOpener(KEY, "c2s")
    one, two = sealer.seal({"i": 1}), sealer.seal({"i": 2})
    with pytest.raises(ProtocolViolation):
        opener.open(two)
    assert opener.open(one) == {"i": 1}


def test_a_tampered_ciphertext_fails_authentication_without_advancing() -> None:
    sealer, opener = FrameSealer(KEY, "c2s"), FrameOpener(KEY, "c2s")
    frame = bytearray(sealer.seal({"i": 1}))
    frame[-1] ^= 0x01
    with pytest.raises(ProtocolViolation, match="failed authentication"):
        opener.open(bytes(frame))
    assert opener.last_seq == 0


def test_a_rewritten_seq_header_fails_authentication() -> None:
    sealer, opener = FrameSealer(KEY, "c2s"), FrameOpener(KEY, "c2s")
    sealer.seal({"i": 1})
    second = sealer.seal({"i": 2})
    forged = (1).to_bytes(8, "big") + second[8:]
    with pytest.raises(ProtocolViolation, match="failed authentication"):
        opener.open(forged)


def test_a_frame_reflected_to_its_sender_direction_does_not_open() -> None:
    frame = FrameSealer(KEY, "c2s").seal({"i": 1})
    with pytest.raises(ProtocolViolation, match="failed authentication"):
        FrameOpener(KEY, "s2c").open(frame)


def test_a_frame_from_another_session_does_not_open() -> None:
    (_, client_a), (server_b, _) = handshake(), handshake()
    with pytest.raises(ProtocolViolation, match="failed authentication"):
        server_b.opener.open(client_a.sealer.seal({"i": 1}))


def test_a_short_frame_is_refused() -> None:
    with pytest.raises(ProtocolViolation, match="too short"):
        FrameOpener(KEY, "c2s").open(b"\x00" * 23)


@pytest.mark.parametrize("payload", [b"not json", b"\xff\xfe", b"[1, 2]", b'"text"'])
def test_bad_json_is_refused_without_advancing(payload: bytes) -> None:
    opener = FrameOpener(KEY, "c2s")
    seq = (1).to_bytes(8, "big")
    sealed = AESGCM(KEY).encrypt(b"\x00" * 4 + seq, payload, b"conveyor-peer-v1 c2s" + seq)
    with pytest.raises(ProtocolViolation, match="JSON"):
        opener.open(seq + sealed)
    assert opener.last_seq == 0


def test_an_unsupported_protocol_version_is_refused_in_both_hellos() -> None:
    acceptor = AcceptorHandshake()
    hello = {**acceptor.hello(), "protocol_version": 2}
    with pytest.raises(ProtocolViolation, match="unsupported protocol_version 2"):
        dialer_handshake(hello)
    response, _ = dialer_handshake(acceptor.hello())
    with pytest.raises(ProtocolViolation, match="unsupported protocol_version"):
        acceptor.complete({**response, "protocol_version": "1"})


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("ephemeral_pub", base64.b64encode(b"x" * 31).decode(), "ephemeral_pub must be 32 bytes"),
        ("ephemeral_pub", "!!!", "ephemeral_pub is not valid base64"),
        ("nonce_c", base64.b64encode(b"x" * 16).decode(), "nonce_c must be 32 bytes"),
        ("nonce_c", 7, "nonce_c must be base64 text"),
        ("type", "peer.hello", "expected peer.hello.response"),
    ],
)
def test_a_malformed_hello_response_is_refused(field: str, value: object, message: str) -> None:
    acceptor = AcceptorHandshake()
    response, _ = dialer_handshake(acceptor.hello())
    with pytest.raises(ProtocolViolation, match=message):
        acceptor.complete({**response, field: value})


def test_a_low_order_ephemeral_key_is_refused() -> None:
    acceptor = AcceptorHandshake()
    response, _ = dialer_handshake(acceptor.hello())
    zero = base64.b64encode(b"\x00" * 32).decode()
    with pytest.raises(ProtocolViolation, match="not usable"):
        acceptor.complete({**response, "ephemeral_pub": zero})


def test_each_handshake_uses_fresh_nonces_and_keys() -> None:
    (a, _), (b, _) = handshake(), handshake()
    assert a.th != b.th


def test_plaintext_hellos_must_be_json_objects() -> None:
    assert parse_plaintext('{"type": "peer.hello"}') == {"type": "peer.hello"}
    for text in ("nope", "[1]"):
        with pytest.raises(ProtocolViolation):
            parse_plaintext(text)
