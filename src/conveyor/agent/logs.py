"""Per-step log batching on the agent side (docs/design/execution.md §9).

Lines are grouped into chunks flushed at 64 lines, 32 KiB or 100 ms; `seq` starts at 0 per step; lines over
64 KiB are split; at the step's byte limit one `log truncated` line is written and the rest dropped.
Pure apart from the injected clock, so the runner's timer only has to call `due`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

MAX_CHUNK_LINES = 64
MAX_CHUNK_BYTES = 32 * 1024
FLUSH_INTERVAL_S = 0.1
MAX_LINE_BYTES = 64 * 1024
DEFAULT_LOG_MAX_BYTES = 10 * 1024 * 1024


def split_long_line(text: str, limit: int = MAX_LINE_BYTES) -> list[str]:
    """Pieces of at most `limit` UTF-8 bytes, never splitting a character."""
    data = text.encode("utf-8")
    if len(data) <= limit:
        return [text]
    pieces: list[str] = []
    while data:
        cut = min(limit, len(data))
        while cut < len(data) and (data[cut] & 0xC0) == 0x80:
            cut -= 1
        pieces.append(data[:cut].decode("utf-8"))
        data = data[cut:]
    return pieces


def _size_label(limit: int) -> str:
    if limit % (1024 * 1024) == 0:
        return f"{limit // (1024 * 1024)} MiB"
    if limit % 1024 == 0:
        return f"{limit // 1024} KiB"
    return f"{limit} bytes"


@dataclass
class StepLog:
    """The batch being built for one step, and what has been sent so far."""

    step_index: int
    max_bytes: int
    clock: Callable[[], float] = time.monotonic
    seq: int = 0
    sent_bytes: int = 0
    truncated: bool = False
    lines: list[dict[str, Any]] = field(default_factory=list)
    batch_bytes: int = 0
    batch_started: float | None = None

    def add(self, text: str, stream: str, ts_ms: int | None = None) -> list[dict[str, Any]]:
        """Add one line (without its newline); returns the chunks that became full."""
        ready: list[dict[str, Any]] = []
        stamp = ts_ms if ts_ms is not None else int(time.time() * 1000)
        for piece in split_long_line(text):
            if self.truncated:
                break
            size = len(piece.encode("utf-8")) + 1
            if self.sent_bytes + self.batch_bytes + size > self.max_bytes:
                self.truncated = True
                piece = f"log truncated at {_size_label(self.max_bytes)}"
                stream, size = "sys", len(piece) + 1
            if self.batch_started is None:
                self.batch_started = self.clock()
            self.lines.append({"ts": stamp, "stream": stream, "text": piece})
            self.batch_bytes += size
            if len(self.lines) >= MAX_CHUNK_LINES or self.batch_bytes >= MAX_CHUNK_BYTES:
                ready.append(self.take())
        return ready

    def due(self) -> dict[str, Any] | None:
        """The pending chunk if it is older than the flush interval."""
        if self.lines and self.batch_started is not None:
            if self.clock() - self.batch_started >= FLUSH_INTERVAL_S:
                return self.take()
        return None

    def take(self) -> dict[str, Any]:
        """The pending lines as a chunk (call only when there are lines)."""
        chunk = {"step_index": self.step_index, "seq": self.seq, "lines": self.lines}
        self.seq += 1
        self.sent_bytes += self.batch_bytes
        self.lines, self.batch_bytes, self.batch_started = [], 0, None
        return chunk

    def flush(self) -> dict[str, Any] | None:
        """The pending chunk, whatever its age."""
        return self.take() if self.lines else None
