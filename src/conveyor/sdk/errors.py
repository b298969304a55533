"""Coded authoring errors (`file:line: CODE message`), raised at definition time or by the compiler."""

from __future__ import annotations

import difflib
import sys
from collections.abc import Iterable
from pathlib import Path

from conveyor.errors import ConveyorError

_SDK_DIR = str(Path(__file__).resolve().parent)


class AuthoringError(ConveyorError):
    """A problem in a workflow definition, carrying an docs/design/authoring.md §3 code and its source
    location."""

    def __init__(self, code: str, message: str, *, file: str | None = None, line: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.file = file
        self.line = line

    def __str__(self) -> str:
        return f"{self.file or '?'}:{self.line or 0}: {self.code} {self.message}"


def caller_location() -> tuple[str, int]:
    """The file and line of the innermost frame outside the SDK: the user's declaring call."""
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not str(Path(filename).resolve()).startswith(_SDK_DIR):
            return filename, frame.f_lineno
        frame = frame.f_back  # type: ignore[assignment]
    return "<unknown>", 0


def authoring_error(code: str, message: str, location: tuple[str, int] | None = None) -> AuthoringError:
    """Build an `AuthoringError` located at `location`, or at the user's calling line."""
    file, line = location if location is not None else caller_location()
    return AuthoringError(code, message, file=file, line=line)


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """`; did you mean 'matrix'?` for the known name nearest to a misspelt `name` ('' when none is near)."""
    nearest = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
    return f"; did you mean {nearest[0]!r}?" if nearest else ""
