"""The worker's durable outbox (docs/design/cluster.md §4.5): terminal job progress survives a crash or a cut
link.

Before a worker sends a job's terminal `job.progress` it writes `$CONVEYOR_HOME/outbox/<job_id>.json`
`{owner, message, written_at}` and fsyncs the file and the directory. The file is deleted when a
coordinator acknowledges the progress (`job.progress.ack`), replayed on every (re)connect, and pruned
after 24 h with a warning. Secrets and clone tokens never reach it: terminal progress carries none.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

log = logging.getLogger(__name__)

OUTBOX_MAX_AGE = timedelta(hours=24)
# Job ids are UUIDv7 strings; anything else is not a file name the outbox writes.
_JOB_ID = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")


@dataclass(frozen=True)
class OutboxMetrics:
    """`conveyor_worker_outbox_expired_total` and `conveyor_worker_outbox_pending`, in a registry."""

    expired: Counter
    pending: Gauge

    @classmethod
    def create(cls, registry: CollectorRegistry | None = None) -> OutboxMetrics:
        """The two collectors in `registry` (a private one when None)."""
        registry = registry if registry is not None else CollectorRegistry()
        return cls(
            Counter(
                "conveyor_worker_outbox_expired_total",
                "Terminal job progress dropped from the worker outbox unacknowledged after 24 h",
                registry=registry,
            ),
            Gauge(
                "conveyor_worker_outbox_pending",
                "Terminal job progress waiting in the worker outbox",
                registry=registry,
            ),
        )


def outbox_expired(written_at: float, now: float, max_age_s: float = OUTBOX_MAX_AGE.total_seconds()) -> bool:
    """Whether an entry written at `written_at` (epoch s) is past its keep-time at `now` (pure)."""
    return now - written_at > max_age_s


@dataclass(frozen=True)
class OutboxEntry:
    """One unacknowledged terminal progress."""

    job_id: str
    owner: str | None
    message: dict[str, Any]
    written_at: float


def _fsync_directory(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Outbox:
    """The `outbox/` directory under a worker's home."""

    def __init__(
        self, home: Path, *, clock: Callable[[], float] = time.time, metrics: OutboxMetrics | None = None
    ) -> None:
        self.directory = home / "outbox"
        self.clock = clock
        self.metrics = metrics or OutboxMetrics.create()
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.metrics.pending.set(len(self._files()))

    def _path(self, job_id: str) -> Path:
        if not _JOB_ID.match(job_id):
            raise ValueError(f"{job_id!r} is not a job id")
        return self.directory / f"{job_id}.json"

    def _files(self) -> list[Path]:
        return sorted(self.directory.glob("*.json"))

    def write(self, job_id: str, owner: str | None, message: dict[str, Any]) -> None:
        """Persist one terminal progress durably (temp file, fsync, rename, fsync the directory)."""
        path = self._path(job_id)
        temporary = path.with_suffix(".json.tmp")
        body = json.dumps({"owner": owner, "message": message, "written_at": self.clock()})
        with open(temporary, "w", encoding="utf-8") as handle:
            handle.write(body)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
        _fsync_directory(self.directory)
        self.metrics.pending.set(len(self._files()))

    def delete(self, job_id: str) -> bool:
        """The progress was acknowledged: forget it; whether there was an entry."""
        try:
            self._path(job_id).unlink()
        except (FileNotFoundError, ValueError):
            return False
        _fsync_directory(self.directory)
        self.metrics.pending.set(len(self._files()))
        return True

    def pending(self) -> list[OutboxEntry]:
        """Every entry to replay, oldest first; entries past 24 h are pruned (warning + metric)."""
        now = self.clock()
        entries: list[OutboxEntry] = []
        for path in self._files():
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
                entry = OutboxEntry(
                    path.stem, data.get("owner"), dict(data["message"]), float(data["written_at"])
                )
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.warning("ignored an unreadable outbox entry %s: %s", path.name, exc)
                continue
            if outbox_expired(entry.written_at, now):
                log.warning(
                    "dropped the unacknowledged result of job %s from the outbox after 24 h",
                    entry.job_id,
                    extra={"job_id": entry.job_id},
                )
                self.metrics.expired.inc()
                path.unlink(missing_ok=True)
                continue
            entries.append(entry)
        self.metrics.pending.set(len(entries))
        return sorted(entries, key=lambda item: item.written_at)

    def __contains__(self, job_id: object) -> bool:
        return isinstance(job_id, str) and _JOB_ID.match(job_id) is not None and self._path(job_id).exists()
