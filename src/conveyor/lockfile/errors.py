"""Errors of reading a lock file (codes from docs/design/authoring.md §3) and compile diagnostics."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from conveyor.errors import ConveyorError


class LockReadError(ConveyorError):
    """A lock file that cannot be used; `code` is one of the reader's error codes."""

    code: str = "lock_invalid"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class LockMissing(LockReadError):
    """There is no lock file: nothing matches."""

    code = "lock_missing"


class LockInvalidJson(LockReadError):
    """The file is not JSON."""

    code = "lock_invalid_json"


class LockTooLarge(LockReadError):
    """The file is over the size limit (5 MiB, or `lock_file_max_bytes` on the orchestrator)."""

    code = "lock_too_large"


class LockInvalid(LockReadError):
    """The JSON does not fit the schema (unknown fields, wrong types, bad patterns, templates or cron)."""

    code = "lock_invalid"


class LockSchemaTooOld(LockReadError):
    """`schema_version` is below the supported window."""

    code = "lock_schema_too_old"


class LockSchemaTooNew(LockReadError):
    """`schema_version` is above the supported window: the reader must be upgraded."""

    code = "lock_schema_too_new"


@dataclass(frozen=True, slots=True)
class Diagnostic:
    """A compile error or warning, printed as `file:line: CODE message`."""

    severity: Literal["error", "warning"]
    code: str
    file: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.code} {self.message}"

    def as_dict(self) -> dict[str, object]:
        """The `--json` form."""
        return {"code": self.code, "file": self.file, "line": self.line, "message": self.message}
