"""The agent's durable outbox (docs/design/execution.md §6): terminal statuses survive a crash of the agent.

`step.finished`, `job.finished` and `event.emit` get the next `oseq` and are appended as one JSON line to
`<home>/outbox.jsonl`, flushed and `fsync`ed, before they are sent. The orchestrator's `status.ack {oseq}`
(for `event.emit`: its `event.emit.result`) acknowledges an entry; acknowledgements are recorded in
`<home>/outbox.acked`, written to a temporary file, fsync'ed and renamed over the old one. Once every entry
is acknowledged the outbox file is truncated. After a restart the entries above the watermark that are not
acknowledged are replayed in `oseq` order.

Crash safety: a torn last line (the agent died mid-write) is ignored and cut off, so the next append starts
on a fresh line; the watermark is written before the outbox is truncated, so a crash in between leaves only
entries the watermark already covers.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

OUTBOX_FILE = "outbox.jsonl"
ACKED_FILE = "outbox.acked"
DURABLE_TYPES = frozenset({"step.finished", "job.finished", "event.emit"})


def _fsync_directory(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class Outbox:
    """Durable, ordered, acknowledged messages of one agent home.

    Not thread-safe: the agent uses it from its event loop only. Appends block for one `fsync`.
    """

    def __init__(self, home: Path) -> None:
        self.home = home
        self.path = home / OUTBOX_FILE
        self.acked_path = home / ACKED_FILE
        self.watermark = 0  # every oseq <= watermark is acknowledged
        self.acked_above: set[int] = set()  # acknowledged out of order, above the watermark
        self.entries: dict[int, dict[str, Any]] = {}  # pending: oseq -> message
        self.next_oseq = 1
        home.mkdir(parents=True, exist_ok=True)
        self._load()

    # -- loading ------------------------------------------------------------------------------------

    def _load(self) -> None:
        self._load_watermark()
        highest = self.watermark
        if self.path.exists():
            data = self.path.read_bytes()
            complete_end = data.rfind(b"\n") + 1
            if complete_end < len(data):
                log.warning("outbox: ignoring a torn last line (%d bytes)", len(data) - complete_end)
                with open(self.path, "r+b") as handle:
                    handle.truncate(complete_end)
                    handle.flush()
                    os.fsync(handle.fileno())
            for number, raw in enumerate(data[:complete_end].splitlines(), start=1):
                if not raw.strip():
                    continue
                try:
                    entry = json.loads(raw)
                    oseq = int(entry["oseq"])
                except (ValueError, KeyError, TypeError):
                    log.warning("outbox: ignoring unreadable line %d", number)
                    continue
                highest = max(highest, oseq)
                if oseq > self.watermark and oseq not in self.acked_above:
                    self.entries[oseq] = entry
        self.next_oseq = highest + 1
        self._compact_if_done()

    def _load_watermark(self) -> None:
        try:
            document = json.loads(self.acked_path.read_text(encoding="utf-8"))
            self.watermark = int(document["watermark"])
            self.acked_above = {int(x) for x in document.get("above", []) if int(x) > self.watermark}
        except FileNotFoundError:
            pass
        except (ValueError, KeyError, TypeError, OSError):
            log.warning("outbox: unreadable %s, treating nothing as acknowledged", self.acked_path)

    # -- writing ------------------------------------------------------------------------------------

    def append(self, message: Mapping[str, Any]) -> dict[str, Any]:
        """Give `message` the next `oseq`, write and fsync it; returns the stored entry (send that)."""
        entry = {**message, "oseq": self.next_oseq}
        line = (json.dumps(entry, separators=(",", ":"), default=str) + "\n").encode()
        with open(self.path, "ab") as handle:
            handle.write(line)
            handle.flush()
            os.fsync(handle.fileno())
        self.entries[entry["oseq"]] = entry
        self.next_oseq += 1
        return entry

    def ack(self, oseq: int) -> bool:
        """Acknowledge one entry; False when it was not pending (a duplicate or unknown ack)."""
        if oseq not in self.entries:
            return False
        del self.entries[oseq]
        if self.entries:
            # Acks may arrive out of order: the watermark stops below the first pending entry and the
            # acknowledged ones above it are listed in the watermark file.
            self.watermark = min(self.entries) - 1
            self.acked_above = {x for x in (*self.acked_above, oseq) if x > self.watermark}
        else:
            self.watermark, self.acked_above = self.next_oseq - 1, set()
        self._write_watermark()
        self._compact_if_done()
        return True

    def ack_emit(self, request_id: str) -> int | None:
        """Acknowledge the pending `event.emit` with this `request_id`; its oseq, or None."""
        for oseq, entry in sorted(self.entries.items()):
            if entry.get("type") == "event.emit" and entry.get("request_id") == request_id:
                self.ack(oseq)
                return oseq
        return None

    def _write_watermark(self) -> None:
        document = {
            "watermark": self.watermark,
            "above": sorted(x for x in self.acked_above if x > self.watermark),
        }
        temporary = self.acked_path.with_name(self.acked_path.name + ".tmp")
        with open(temporary, "w", encoding="utf-8") as handle:
            handle.write(json.dumps(document))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, self.acked_path)
        _fsync_directory(self.home)

    def _compact_if_done(self) -> None:
        """Truncate the outbox file once nothing in it is pending."""
        if self.entries or not self.path.exists() or self.path.stat().st_size == 0:
            return
        if self.watermark < self.next_oseq - 1:
            self.watermark = self.next_oseq - 1
            self.acked_above.clear()
            self._write_watermark()
        with open(self.path, "r+b") as handle:
            handle.truncate(0)
            handle.flush()
            os.fsync(handle.fileno())

    # -- reading ------------------------------------------------------------------------------------

    def pending(self) -> list[dict[str, Any]]:
        """Unacknowledged entries in `oseq` order (what to resend after `register.ack`)."""
        return [self.entries[oseq] for oseq in sorted(self.entries)]

    def unacked_jobs(self) -> list[str]:
        """Job ids with unacknowledged entries, in order of their first entry (`agent.register`)."""
        jobs: list[str] = []
        for entry in self.pending():
            job_id = entry.get("job_id")
            if isinstance(job_id, str) and job_id not in jobs:
                jobs.append(job_id)
        return jobs

    def has_pending(self, job_id: str | None = None) -> bool:
        """Whether anything (of `job_id`) awaits an acknowledgement."""
        if job_id is None:
            return bool(self.entries)
        return any(entry.get("job_id") == job_id for entry in self.entries.values())

    def __len__(self) -> int:
        return len(self.entries)
