"""The one lock-file reader (orchestrator, agent, `preview --lock`) and the deterministic writer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from conveyor.lockfile.errors import (
    LockInvalid,
    LockInvalidJson,
    LockMissing,
    LockSchemaTooNew,
    LockSchemaTooOld,
    LockTooLarge,
)
from conveyor.lockfile.models import (
    LOCK_SCHEMA_MIN_READ,
    LOCK_SCHEMA_VERSION,
    Lock,
    PatternEntry,
    RegexCondition,
    ScheduleTriggerEntry,
)
from conveyor.lockfile.upgrade import upgrade_lock_json
from conveyor.sdk.patterns import regex_problem
from conveyor.sdk.templates import TemplateSyntaxError, check_template

LOCK_PATH = ".conveyor/conveyor.lock.json"
MAX_LOCK_BYTES = 5 * 1024 * 1024


def render_lock(lock: Lock) -> bytes:
    """Serialise deterministically: model key order, 2-space indent, UTF-8, LF, trailing newline."""
    document = lock.model_dump(mode="json", by_alias=True)
    return (json.dumps(document, indent=2, ensure_ascii=False) + "\n").encode()


def check_lock_size(size: int, max_bytes: int = MAX_LOCK_BYTES) -> None:
    """Raise `LockTooLarge` when a lock of `size` bytes is over `max_bytes` (`lock_file_max_bytes`)."""
    if size > max_bytes:
        raise LockTooLarge(
            f"lock file is {size} bytes, over the {max_bytes}-byte limit (lock_file_max_bytes)"
        )


def parse_lock(data: bytes | str, max_bytes: int = MAX_LOCK_BYTES) -> Lock:
    """Parse and validate lock-file bytes, upgrading older schemas; raises a `LockReadError` subclass."""
    raw = data.encode() if isinstance(data, str) else data
    check_lock_size(len(raw), max_bytes)
    try:
        document = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise LockInvalidJson(f"lock file is not valid JSON: {error}") from None
    if not isinstance(document, dict):
        raise LockInvalid("lock file must be a JSON object")
    version = document.get("schema_version")
    if isinstance(version, bool) or not isinstance(version, int):
        raise LockInvalid("schema_version: must be an integer")
    if version < LOCK_SCHEMA_MIN_READ:
        raise LockSchemaTooOld(
            f"lock schema_version {version} is too old (this Conveyor reads {LOCK_SCHEMA_MIN_READ}–"
            f"{LOCK_SCHEMA_VERSION}); recompile with a current conveyor CLI"
        )
    if version > LOCK_SCHEMA_VERSION:
        raise LockSchemaTooNew(
            f"lock schema_version {version} is too new: this Conveyor reads lock schema versions "
            f"{LOCK_SCHEMA_MIN_READ}–{LOCK_SCHEMA_VERSION}; upgrade Conveyor (servers before CLIs)"
        )
    document = upgrade_lock_json(document, to_version=LOCK_SCHEMA_VERSION)
    try:
        lock = Lock.model_validate(document)
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in item['loc'])}: {item['msg']}" for item in error.errors()[:10]
        )
        raise LockInvalid(f"lock file does not match schema v{LOCK_SCHEMA_VERSION}: {problems}") from None
    recheck_lock(lock)
    return lock


def load_lock(path: Path) -> Lock:
    """Read and parse a lock file from disk (`LockMissing` when absent)."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise LockMissing(f"{path.name} not found; run `conveyor compile` and commit the lock") from None
    if size > MAX_LOCK_BYTES:
        raise LockTooLarge(f"lock file is {size} bytes, over the {MAX_LOCK_BYTES}-byte limit")
    return parse_lock(path.read_bytes())


def _walk_patterns(value: Any, where: str) -> list[tuple[str, PatternEntry | RegexCondition]]:
    found: list[tuple[str, PatternEntry | RegexCondition]] = []
    if isinstance(value, PatternEntry | RegexCondition):
        found.append((where, value))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found.extend(_walk_patterns(item, f"{where}[{index}]"))
    elif isinstance(value, dict):
        for key, item in value.items():
            found.extend(_walk_patterns(item, f"{where}.{key}"))
    elif isinstance(value, BaseModel):
        for name in type(value).model_fields:
            found.extend(_walk_patterns(getattr(value, name), f"{where}.{name}"))
    return found


def recheck_lock(lock: Lock) -> None:
    """Re-validate what the schema cannot: regexes, templates, cron and timezones (a hand-edited lock)."""
    from zoneinfo import ZoneInfo

    from croniter import croniter

    for workflow in lock.workflows:
        where = f"workflow {workflow.name!r}"
        for location, entry in _walk_patterns(workflow.triggers, f"{where} triggers"):
            is_regex = isinstance(entry, RegexCondition) or entry.kind == "regex"
            pattern = entry.regex if isinstance(entry, RegexCondition) else entry.pattern
            problem = regex_problem(pattern, entry.flags) if is_regex else None
            if problem:
                raise LockInvalid(f"{location}: {problem}")
        for trigger in workflow.triggers:
            if isinstance(trigger, ScheduleTriggerEntry):
                if len(trigger.cron.split()) != 5 or not croniter.is_valid(trigger.cron):
                    raise LockInvalid(f"{where}: invalid cron {trigger.cron!r}")
                try:
                    ZoneInfo(trigger.timezone)
                except Exception:
                    raise LockInvalid(f"{where}: unknown timezone {trigger.timezone!r}") from None
        try:
            if workflow.concurrency is not None:
                check_template(workflow.concurrency.group, job_level=False)
            for job in workflow.jobs:
                keys = tuple(job.matrix.keys) if job.matrix else None
                for template in (job.environment, job.concurrency_group):
                    if template is not None:
                        check_template(template, job_level=True, matrix_keys=keys)
                for matcher in [*job.runs_on.labels, *job.runs_on.exclude]:
                    if matcher.kind == "regex" and (problem := regex_problem(matcher.pattern, matcher.flags)):
                        raise LockInvalid(f"{where} job {job.name!r} runs_on: {problem}")
        except TemplateSyntaxError as error:
            raise LockInvalid(f"{where}: {error}") from None
