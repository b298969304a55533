"""The lock file: schema (pydantic), compiler (discover, import, validate, hash) and the one reader."""

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
