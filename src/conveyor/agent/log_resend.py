"""Log chunks the agent wrote to a connection but cannot yet know were applied (docs/design/execution.md §9).

A `log.chunk` is not durable: written to a socket whose orchestrator (or worker) dies before reading it,
it is gone, and the job's log keeps a hole. The orchestrator applies one connection's frames in order and
answers each `heartbeat` (`heartbeat.ack`) and each durable entry (`status.ack`) when it reaches them, so
an answer to a frame written after a chunk proves the chunk was applied. Until then the chunk stays here,
and a new connection sends it again before anything else; a chunk whose `seq` was stored already is
dropped there as a duplicate, so sending it twice is harmless.

Pure bookkeeping: the connection calls `wrote` after each frame it wrote, `answered` for each answer it reads,
`connection_lost` when the socket ends, and `take`/`keep_unsent` around the resend.
"""

from __future__ import annotations

import collections
import sys
from collections.abc import Mapping
from typing import Any

from conveyor.model import protocol as p

# A frame written on an earlier connection: no answer on the current one can confirm it.
UNWRITTEN = sys.maxsize

AnswerKey = tuple[str, float]


class LogResendWindow:
    """The chunks written and not yet confirmed, oldest first, at most `limit` of them."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.chunks: collections.deque[tuple[int, dict[str, Any]]] = collections.deque()
        self.written = 0  # frames written on the current connection
        self.awaiting: dict[AnswerKey, int] = {}  # frame awaiting an answer -> its place in `written`
        self.dropped = 0  # chunks pushed out by the limit: their loss shows as a gap in the job's log

    def wrote(self, document: Mapping[str, Any]) -> None:
        """A frame went out on the current connection."""
        self.written += 1
        kind = document.get("type")
        if kind == "log.chunk":
            self.chunks.append((self.written, dict(document)))
            while len(self.chunks) > self.limit:
                self.chunks.popleft()
                self.dropped += 1
        elif kind == "heartbeat" and document.get("ts") is not None:
            self.awaiting[("heartbeat", float(document["ts"]))] = self.written
        elif "oseq" in document:
            self.awaiting[("oseq", float(document["oseq"]))] = self.written

    def answered(self, message: p.OrchestratorMessage) -> None:
        """An answer read on the current connection: the chunks written before its frame are applied."""
        if isinstance(message, p.StatusAck):
            key: AnswerKey = ("oseq", float(message.oseq))
        elif isinstance(message, p.HeartbeatAck):
            key = ("heartbeat", float(message.ts))
        else:
            return
        place = self.awaiting.pop(key, None)
        if place is None:
            return
        # Frames are applied in order: whatever was written before this one has been answered too.
        self.awaiting = {other: at for other, at in self.awaiting.items() if at > place}
        while self.chunks and self.chunks[0][0] < place:
            self.chunks.popleft()

    def connection_lost(self) -> None:
        """The socket ended: its pending answers will never come, and every chunk kept must go out again."""
        self.written = 0
        self.awaiting.clear()
        self.chunks = collections.deque((UNWRITTEN, chunk) for _, chunk in self.chunks)

    def take(self) -> list[dict[str, Any]]:
        """The chunks to send again on a new connection, oldest first (`wrote` keeps each as it goes out)."""
        chunks = [chunk for _, chunk in self.chunks]
        self.chunks.clear()
        return chunks

    def keep_unsent(self, chunks: list[dict[str, Any]]) -> None:
        """Chunks `take` returned that could not be written before the connection failed: kept, in order."""
        self.chunks.extend((UNWRITTEN, chunk) for chunk in chunks)
