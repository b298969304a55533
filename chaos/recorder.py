"""The run's history as it happens: records with their time since the start, kept in memory and appended
to `history.jsonl` in the work directory (thread-safe: the load and the faults record from their threads)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

from chaos.checker import History


class Recorder:
    """Appends records to a `History` and to a file."""

    def __init__(self, history: History, path: Path) -> None:
        self.history = history
        self._monotonic0 = time.monotonic()
        self._file = open(path, "a")
        self._lock = threading.Lock()

    def now(self) -> float:
        """Seconds since the start."""
        return time.monotonic() - self._monotonic0

    def record(self, type_: str, **fields: Any) -> dict[str, Any]:
        """Append one record of `type_`."""
        entry = {"t": round(self.now(), 3), "type": type_, **fields}
        with self._lock:
            self.history.records.append(entry)
            self._file.write(json.dumps(entry, default=str) + "\n")
            self._file.flush()
        return entry

    def webhook(self, fields: dict[str, Any]) -> None:
        """A webhook and the answer it got."""
        self.record("webhook", **fields)

    def note(self, what: str, **fields: Any) -> None:
        """Something worth reading in a report (a harness error, a skipped fault)."""
        self.record("note", what=what, **fields)

    def close(self) -> None:
        """Close the file."""
        with self._lock:
            self._file.close()
