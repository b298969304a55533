"""The lock file: schema (pydantic), compiler (discover, import, validate, hash) and the one reader.

Names are imported lazily, so that a step process can load `conveyor.lockfile.loader` without the schema.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from conveyor.lockfile.compiler import CompileResult, LockDrift, compile_repository, lock_drift
    from conveyor.lockfile.errors import (
        Diagnostic,
        LockInvalid,
        LockInvalidJson,
        LockMissing,
        LockReadError,
        LockSchemaTooNew,
        LockSchemaTooOld,
        LockTooLarge,
    )
    from conveyor.lockfile.hashing import content_hash, content_hash_of_checkout
    from conveyor.lockfile.models import LOCK_SCHEMA_MIN_READ, LOCK_SCHEMA_VERSION, Lock, WorkflowEntry
    from conveyor.lockfile.reader import LOCK_PATH, check_lock_size, load_lock, parse_lock, render_lock

_EXPORTS = {
    "CompileResult": "conveyor.lockfile.compiler",
    "Diagnostic": "conveyor.lockfile.errors",
    "LOCK_PATH": "conveyor.lockfile.reader",
    "LOCK_SCHEMA_MIN_READ": "conveyor.lockfile.models",
    "LOCK_SCHEMA_VERSION": "conveyor.lockfile.models",
    "Lock": "conveyor.lockfile.models",
    "LockDrift": "conveyor.lockfile.compiler",
    "LockInvalid": "conveyor.lockfile.errors",
    "LockInvalidJson": "conveyor.lockfile.errors",
    "LockMissing": "conveyor.lockfile.errors",
    "LockReadError": "conveyor.lockfile.errors",
    "LockSchemaTooNew": "conveyor.lockfile.errors",
    "LockSchemaTooOld": "conveyor.lockfile.errors",
    "LockTooLarge": "conveyor.lockfile.errors",
    "WorkflowEntry": "conveyor.lockfile.models",
    "check_lock_size": "conveyor.lockfile.reader",
    "compile_repository": "conveyor.lockfile.compiler",
    "content_hash": "conveyor.lockfile.hashing",
    "content_hash_of_checkout": "conveyor.lockfile.hashing",
    "load_lock": "conveyor.lockfile.reader",
    "lock_drift": "conveyor.lockfile.compiler",
    "parse_lock": "conveyor.lockfile.reader",
    "render_lock": "conveyor.lockfile.reader",
}

__all__ = [
    "LOCK_PATH",
    "LOCK_SCHEMA_MIN_READ",
    "LOCK_SCHEMA_VERSION",
    "CompileResult",
    "Diagnostic",
    "Lock",
    "LockDrift",
    "LockInvalid",
    "LockInvalidJson",
    "LockMissing",
    "LockReadError",
    "LockSchemaTooNew",
    "LockSchemaTooOld",
    "LockTooLarge",
    "WorkflowEntry",
    "check_lock_size",
    "compile_repository",
    "content_hash",
    "content_hash_of_checkout",
    "load_lock",
    "lock_drift",
    "parse_lock",
    "render_lock",
]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'conveyor.lockfile' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
