"""Log batching: sequence numbers, flush thresholds, long-line splitting, truncation."""

from __future__ import annotations

from conveyor.agent.logs import MAX_CHUNK_LINES, MAX_LINE_BYTES, StepLog, split_long_line


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_chunk_is_sent_at_64_lines_with_seq_from_zero() -> None:
    log = StepLog(1, 10_000_000, clock=FakeClock())
    chunks = [chunk for i in range(MAX_CHUNK_LINES * 2) for chunk in log.add(f"line {i}", "out")]
    assert [chunk["seq"] for chunk in chunks] == [0, 1]
    assert all(len(chunk["lines"]) == MAX_CHUNK_LINES for chunk in chunks)


def test_pending_lines_are_due_after_100_ms() -> None:
    clock = FakeClock()
    log = StepLog(1, 10_000_000, clock=clock)
    log.add("one", "out")
    assert log.due() is None
    clock.now = 0.1
    chunk = log.due()
    assert chunk is not None and [line["text"] for line in chunk["lines"]] == ["one"]


def test_long_lines_are_split_without_breaking_characters() -> None:
    text = "é" * MAX_LINE_BYTES
    pieces = split_long_line(text)
    assert "".join(pieces) == text
    assert all(len(piece.encode()) <= MAX_LINE_BYTES for piece in pieces)


def test_log_is_truncated_at_the_limit_with_one_notice() -> None:
    log = StepLog(1, 100, clock=FakeClock())
    for _ in range(20):
        log.add("0123456789", "out")
    chunk = log.flush()
    assert chunk is not None
    texts = [line["text"] for line in chunk["lines"]]
    assert texts[-1] == "log truncated at 100 bytes"
    assert texts.count("log truncated at 100 bytes") == 1
