"""HTTP `Range` on an artifact's bytes (docs/design/artifacts.md §6): one range or the whole body."""

from __future__ import annotations

import re
from dataclasses import dataclass

from conveyor.errors import ConveyorError

_SPEC = re.compile(r"^\s*(\d*)\s*-\s*(\d*)\s*$")


@dataclass(frozen=True)
class ByteRange:
    """Bytes `[start, end)` of a body of `size` bytes."""

    start: int
    end: int
    size: int

    def content_range(self) -> str:
        """The `Content-Range` header of a 206."""
        return f"bytes {self.start}-{self.end - 1}/{self.size}"


class Unsatisfiable(ConveyorError):
    """The range asks for nothing the body has (416)."""


def parse_range(header: str | None, size: int) -> ByteRange | None:
    """The one range `header` asks for, or None for the whole body (no header, several ranges, a unit
    other than bytes, or a malformed value: RFC 9110 lets a server ignore what it does not serve).

    Raises `Unsatisfiable` when the single range starts past the end or asks for zero bytes.
    """
    if not header:
        return None
    unit, _, specs = header.partition("=")
    if unit.strip().lower() != "bytes" or "," in specs:
        return None
    match = _SPEC.match(specs)
    if match is None:
        return None
    first, last = match.group(1), match.group(2)
    if not first and not last:
        return None
    if not first:  # a suffix: the last N bytes
        count = int(last)
        if count == 0 or size == 0:
            raise Unsatisfiable()
        return ByteRange(max(0, size - count), size, size)
    start = int(first)
    if last and int(last) < start:
        return None
    if start >= size:
        raise Unsatisfiable()
    end = size if not last else min(size, int(last) + 1)
    return ByteRange(start, end, size)
