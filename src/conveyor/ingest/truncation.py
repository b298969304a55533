"""What the event log keeps of a large delivery body: `event_log_max_payload_bytes`
(docs/design/execution.md §1.1).

Pure: the cut body with its marker line, and reading the marker back. A body is cut only once its
delivery has ended with a status that is never processed again, so processing always sees the whole body.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_MARKER = "\n[conveyor: payload truncated, kept {kept} of {received} bytes (event_log_max_payload_bytes)]\n"
_MARKER_AT_END = re.compile(
    rb"\n\[conveyor: payload truncated, kept (\d+) of (\d+) bytes \(event_log_max_payload_bytes\)\]\n\Z"
)
# A delivery that ends `failed` keeps its whole body: `replay` (allowed from `failed` only) processes it again.
KEEPS_WHOLE_BODY = frozenset({"received", "failed"})


@dataclass(frozen=True)
class Truncation:
    """A stored body was cut: `kept` bytes of the `received` ones are stored, before the marker."""

    kept: int
    received: int

    def reason(self) -> str:
        """The `error` of a delivery whose cut body was put back to be processed."""
        return (
            f"payload_truncated: the stored body keeps {self.kept} of {self.received} bytes "
            "(event_log_max_payload_bytes) and cannot be processed again; redeliver it"
        )


def truncated_body(body: bytes, limit: int) -> bytes | None:
    """The body to store in place of `body` once its delivery ended, or None when it fits `limit`."""
    if len(body) <= limit:
        return None
    return body[:limit] + _MARKER.format(kept=limit, received=len(body)).encode()


def should_truncate(status: str) -> bool:
    """Whether a delivery that ended with `status` has its body cut (every end but `failed`)."""
    return status not in KEEPS_WHOLE_BODY


def truncation_of(stored: bytes) -> Truncation | None:
    """The truncation a stored body's marker records, or None for a whole body."""
    found = _MARKER_AT_END.search(stored)
    if found is None:
        return None
    kept, received = int(found.group(1)), int(found.group(2))
    # The marker must sit right after the `kept` bytes it counts: anything else is a body of its own.
    if found.start() != kept or received <= kept:
        return None
    return Truncation(kept=kept, received=received)
