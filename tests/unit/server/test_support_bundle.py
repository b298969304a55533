"""The pure parts of a support bundle (docs/design/admin.md §8.1): redaction, size bounds, the manifest's
per-node outcomes, the log ring and the tar stream."""

from __future__ import annotations

import base64
import io
import json
import logging
import tarfile

from conveyor.server.log_ring import LogRing
from conveyor.server.support_bundle import (
    FILE_CAP_BYTES,
    FRAME_MARGIN_BYTES,
    LOG_FILE,
    NodeRedactor,
    TarStream,
    bound_part,
    cap_text,
    manifest,
    newest_lines,
    node_entry,
    redact_settings,
    redact_url,
    secret_setting_values,
)

SETTINGS = {
    "secret_key": "0f" * 32,
    "secret_key_file": "/etc/conveyor/key",
    "metrics_token": "metrics-Qx81",
    "cluster_join_token": None,
    "blob_s3_access_key_id": "AKIAEXAMPLE",
    "database_url": "postgresql://conveyor:pg-pass-77@db.internal:5432/conveyor",
    "smtp_url": "smtp://mailer@mail.internal:25",
    "port": 8470,
    "knobs": {"agent_token_ttl_ms": 3600000},
}


def test_secret_settings_read_redacted_when_set_and_paths_and_numbers_stay() -> None:
    shown = redact_settings(SETTINGS)
    assert shown["secret_key"] == shown["metrics_token"] == shown["blob_s3_access_key_id"] == "[redacted]"
    assert shown["cluster_join_token"] is None  # unset reads unset
    assert shown["secret_key_file"] == "/etc/conveyor/key"
    assert shown["knobs"] == {"agent_token_ttl_ms": 3600000}  # a TTL named after a token is no secret
    assert shown["database_url"] == "postgresql://conveyor:[redacted]@db.internal:5432/conveyor"
    assert shown["smtp_url"] == "smtp://mailer@mail.internal:25"
    assert shown["port"] == 8470


def test_a_url_password_is_redacted_whatever_the_host() -> None:
    assert redact_url("postgresql://u:p%40ss@[::1]:5432/db") == "postgresql://u:[redacted]@[::1]:5432/db"
    assert redact_url("not a url") == "not a url"
    assert redact_url("https://example.com/x?token=1") == "https://example.com/x?token=1"


def test_the_values_to_mask_are_the_set_secrets_and_url_passwords() -> None:
    values = set(secret_setting_values(SETTINGS))
    assert values == {"0f" * 32, "metrics-Qx81", "AKIAEXAMPLE", "pg-pass-77"}


def test_the_redactor_masks_known_values_their_encodings_tokens_and_bearer_credentials() -> None:
    redactor = NodeRedactor(["pg-pass-77", "s3cr3t-value"])
    encoded = base64.b64encode(b"s3cr3t-value").decode()
    line = (
        f'{{"msg": "connect with pg-pass-77 and {encoded}", "token": "cvy_admin_{"a" * 64}", '
        f'"join": "cvy_join_AbC-_9xYz", "auth": "Bearer abc.def"}}'
    )
    masked = redactor.text(line)
    assert "pg-pass-77" not in masked and encoded not in masked and "abc.def" not in masked
    assert "cvy_admin_[redacted]" in masked and "cvy_join_[redacted]" in masked
    assert "Bearer [redacted]" in masked
    assert json.loads(masked)["msg"] == "connect with *** and ***"


def test_a_file_over_the_cap_is_cut_with_a_marker() -> None:
    text = "é" * FILE_CAP_BYTES  # two bytes each
    cut = cap_text(text)
    assert len(cut.encode()) < FILE_CAP_BYTES + 64
    assert cut.endswith(f"\n[truncated: {FILE_CAP_BYTES} bytes]\n")
    assert cap_text("short") == "short"


def test_the_log_keeps_the_newest_whole_lines_within_its_budget() -> None:
    lines = [f"line {n:03}" for n in range(100)]
    kept = newest_lines(lines, 50)
    assert kept == lines[-len(kept) :] and 0 < len(kept) < 100
    assert sum(len(json.dumps(line)) + 1 for line in kept) <= 50
    assert newest_lines(lines, 0) == []


def test_a_part_fits_its_log_budget_and_one_peer_frame() -> None:
    files = {"node.json": "{}", "settings.json": "x" * (FILE_CAP_BYTES * 2), LOG_FILE: "ignored"}
    lines = ['{"msg": "' + "y" * 1000 + '"}'] * 5000  # ~5 MiB of log, quotes escaped on the wire
    part = bound_part(files, lines, log_bytes=4 * 1024 * 1024, frame_bytes=1024 * 1024)
    assert len(json.dumps({"files": part})) <= 1024 * 1024 - FRAME_MARGIN_BYTES + 1024
    assert part["settings.json"].endswith("bytes]\n") and part[LOG_FILE].endswith('"}\n')
    small = bound_part(files, lines, log_bytes=10_000, frame_bytes=4 * 1024 * 1024)
    assert len(small[LOG_FILE].encode()) <= 10_000


def test_the_manifest_lists_this_node_first_and_each_outcome_with_its_files() -> None:
    entries = [
        node_entry("w1", "worker", "unreachable", "no answer within 15 s"),
        node_entry("c2", "coordinator", "refused", "accepted from coordinators only"),
        node_entry("c1", "coordinator", "collected", "", {"node.json": "{}", LOG_FILE: "é\n"}),
    ]
    document = manifest(
        created_at="2026-01-01T00:00:00.000Z", target="all", log_bytes=1024, me="c1", entries=entries
    )
    assert [n["node"] for n in document["nodes"]] == ["c1", "c2", "w1"]
    assert document["nodes"][0] == {
        "node": "c1",
        "role": "coordinator",
        "outcome": "collected",
        "detail": "",
        "files": [LOG_FILE, "node.json"],
        "bytes": 5,
    }
    assert document["nodes"][2]["files"] == [] and document["nodes"][2]["bytes"] == 0
    assert document["format"] == 1 and document["target"] == "all"


def test_the_ring_drops_the_oldest_lines_past_its_bound() -> None:
    ring = LogRing(max_bytes=100)
    ring.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.getLogger("test.ring")
    logger.propagate = False
    logger.addHandler(ring)
    logger.setLevel(logging.INFO)
    try:
        for n in range(30):
            logger.info("message %02d\nsecond line", n)
    finally:
        logger.removeHandler(ring)
    kept = ring.lines()
    assert kept[-1] == "message 29\\nsecond line"  # one record, one line
    assert sum(len(line) + 1 for line in kept) <= 100 and len(kept) < 30


def test_the_tar_stream_hands_out_bytes_member_by_member_and_reads_back_whole() -> None:
    stream = TarStream(clock=lambda: 1_700_000_000)
    stream.add("c1/node.json", "{}\n")
    first = stream.take()
    stream.add("manifest.json", '{"format": 1}\n')
    data = first + stream.take() + stream.close()
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
        assert archive.getnames() == ["c1/node.json", "manifest.json"]
        member = archive.extractfile("manifest.json")
        assert member is not None and member.read() == b'{"format": 1}\n'
