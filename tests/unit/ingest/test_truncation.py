"""`event_log_max_payload_bytes` (docs/design/execution.md §1.1): the cut body, its marker, and when."""

from __future__ import annotations

from conveyor.ingest.truncation import Truncation, should_truncate, truncated_body, truncation_of


def test_a_body_within_the_limit_is_kept_whole() -> None:
    assert truncated_body(b"x" * 10, 10) is None
    assert truncation_of(b"x" * 10) is None


def test_a_larger_body_keeps_its_first_bytes_and_a_marker_that_reads_back() -> None:
    body = b'{"ref": "refs/heads/main", "padding": "' + b"y" * 100 + b'"}'
    cut = truncated_body(body, 16)
    assert cut is not None and cut.startswith(body[:16])
    assert cut[16:] == (
        f"\n[conveyor: payload truncated, kept 16 of {len(body)} bytes (event_log_max_payload_bytes)]\n".encode()
    )
    assert truncation_of(cut) == Truncation(kept=16, received=len(body))
    assert "16 of" in Truncation(16, len(body)).reason() and Truncation(1, 2).reason().startswith(
        "payload_truncated: "
    )


def test_a_body_that_only_looks_marked_is_not_taken_for_a_cut_one() -> None:
    fake = b"abc\n[conveyor: payload truncated, kept 10 of 20 bytes (event_log_max_payload_bytes)]\n"
    assert truncation_of(fake) is None  # the marker does not follow 10 kept bytes
    odd = b"0123456789\n[conveyor: payload truncated, kept 10 of 5 bytes (event_log_max_payload_bytes)]\n"
    assert truncation_of(odd) is None


def test_every_end_but_failed_cuts_the_body() -> None:
    for status in ("processed", "ignored", "lock_missing", "lock_invalid"):
        assert should_truncate(status)
    assert not should_truncate("failed") and not should_truncate("received")
