"""A node's recent log lines, kept in memory for its support bundle (docs/design/admin.md §8.1).

Conveyor writes no log file (stdout belongs to the service manager), so each server process keeps its
newest records as JSON lines in a ring bounded in bytes: the oldest lines leave first. The handler sits
beside the stdout handler on the root logger, so it sees what stdout sees, at the same level.
"""

from __future__ import annotations

import logging
import threading
from collections import deque

RING_BYTES = 4 * 1024 * 1024
# A single line longer than this is cut: one huge record must not empty the ring.
LINE_MAX_CHARS = 64 * 1024


class LogRing(logging.Handler):
    """The newest formatted records, at most `max_bytes` of them (UTF-8, one line each)."""

    def __init__(self, max_bytes: int = RING_BYTES) -> None:
        super().__init__()
        self.max_bytes = max_bytes
        self._lines: deque[tuple[str, int]] = deque()
        self._bytes = 0
        self._guard = threading.Lock()  # records arrive from worker threads too (`asyncio.to_thread`)

    def emit(self, record: logging.LogRecord) -> None:
        """Keep the record's line, dropping the oldest ones past the bound."""
        try:
            line = self.format(record).replace("\n", "\\n")[:LINE_MAX_CHARS]
        except Exception:
            self.handleError(record)
            return
        size = len(line.encode("utf-8")) + 1
        with self._guard:
            self._lines.append((line, size))
            self._bytes += size
            while self._bytes > self.max_bytes and self._lines:
                _, dropped = self._lines.popleft()
                self._bytes -= dropped

    def lines(self) -> list[str]:
        """Every kept line, oldest first."""
        with self._guard:
            return [line for line, _ in self._lines]


_RING = LogRing()


def log_ring() -> LogRing:
    """This process's ring (a server installs it: `configure_logging(..., keep_recent=True)`)."""
    return _RING
