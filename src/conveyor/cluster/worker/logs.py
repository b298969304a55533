"""A worker's relayed logs: chunks buffered while no coordinator is connected, and chunks kept until the
coordinator acknowledges the job's end."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from conveyor.cluster.messages import LogChunkRelay

LOG_BUFFER_BYTES = 8 * 1024 * 1024


def _chunk_bytes(chunk: LogChunkRelay) -> int:
    return sum(len(str(line.get("text", ""))) for line in chunk.lines)


@dataclass
class LogRelayBuffer:
    """Chunks waiting for a coordinator: at most `limit` bytes per job; past it lines are dropped and the
    next chunk sent carries a `sys` line saying how many were lost."""

    limit: int = LOG_BUFFER_BYTES
    chunks: list[LogChunkRelay] = field(default_factory=list)
    size: int = 0
    dropped_lines: int = 0

    def add(self, chunk: LogChunkRelay) -> None:
        """Keep a chunk, or count its lines as dropped when the buffer is full."""
        size = _chunk_bytes(chunk)
        if self.size + size > self.limit:
            self.dropped_lines += len(chunk.lines)
            return
        self.chunks.append(chunk)
        self.size += size

    def drain(self) -> list[LogChunkRelay]:
        """Everything to send now, in order, the gap marker (if any) on the first chunk after the gap."""
        chunks, self.chunks, self.size = self.chunks, [], 0
        return chunks

    def gap_marker(self) -> dict[str, Any] | None:
        """The `sys` line recording dropped lines (once), or None."""
        if not self.dropped_lines:
            return None
        count, self.dropped_lines = self.dropped_lines, 0
        return {
            "stream": "sys",
            "text": f"[conveyor] {count} log line{'s' if count != 1 else ''} dropped: the worker's "
            f"{self.limit // (1024 * 1024)} MiB buffer filled while no coordinator was connected",
        }


@dataclass
class RelayedLogs:
    """Chunks sent to a coordinator, kept per job until the coordinator acknowledges the job's end.

    A chunk is not durable: one written to a coordinator that dies (or a link cut) before reading it is gone.
    The coordinator applies a worker's job messages in order and acknowledges the job's result after its
    commit, and the result is sent after the job's last chunk, so that acknowledgement proves every chunk
    applied — when it comes over the session the chunks went on. So each job remembers that session: before
    anything more of the job goes on another one (a reopened session, or another coordinator because the
    job's own went away), its kept chunks go there first; the coordinator drops those it stored already
    (their `seq`). At most `limit` bytes per job, oldest dropped.
    """

    limit: int = LOG_BUFFER_BYTES
    by_job: dict[str, tuple[str | None, list[LogChunkRelay], int]] = field(default_factory=dict)
    # The session each job's kept chunks were last sent on (compared by identity: a reconnection is new).
    sessions: dict[str, Any] = field(default_factory=dict)

    def sent(self, owner: str | None, chunk: LogChunkRelay, session: Any = None) -> None:
        """A chunk went out to the job's coordinator on `session`."""
        _, chunks, size = self.by_job.get(chunk.job_id, (owner, [], 0))
        chunks.append(chunk)
        size += _chunk_bytes(chunk)
        while size > self.limit and len(chunks) > 1:
            size -= _chunk_bytes(chunks.pop(0))
        self.by_job[chunk.job_id] = (owner, chunks, size)
        self.sessions[chunk.job_id] = session

    def behind(self, job_id: str, session: Any) -> list[LogChunkRelay]:
        """The job's kept chunks when they went on another session than `session` (else none)."""
        kept = self.by_job.get(job_id)
        if kept is None or self.sessions.get(job_id) is session:
            return []
        return list(kept[1])

    def caught_up(self, job_id: str, session: Any) -> None:
        """The job's kept chunks were sent again on `session`."""
        if job_id in self.by_job:
            self.sessions[job_id] = session

    def confirmed(self, job_id: str) -> None:
        """The job's end was acknowledged: its chunks are all applied."""
        self.by_job.pop(job_id, None)
        self.sessions.pop(job_id, None)

    def owners(self) -> list[tuple[str, str | None]]:
        """`(job, coordinator)` of every job with kept chunks."""
        return [(job_id, owner) for job_id, (owner, _, _) in self.by_job.items()]

    def keep_only(self, job_ids: set[str]) -> None:
        """Forget the jobs that are neither held nor awaiting their result's acknowledgement."""
        for job_id in set(self.by_job) - job_ids:
            del self.by_job[job_id]
            self.sessions.pop(job_id, None)
