"""The one reader rejects what it cannot trust, with the codes of docs/design/authoring.md §3."""

import json

import pytest

from conveyor.lockfile import (
    LOCK_SCHEMA_VERSION,
    LockInvalid,
    LockInvalidJson,
    LockMissing,
    LockSchemaTooNew,
    LockSchemaTooOld,
    LockTooLarge,
    load_lock,
    parse_lock,
)
from conveyor.lockfile.hashing import content_hash

MINIMAL = {"schema_version": 1, "workflows": []}


def _workflow(**overrides):
    entry = {
        "name": "ci",
        "description": None,
        "source": {"file": ".conveyor/workflows/ci.py", "qualname": "ci", "line": 1},
        "content_hash": "sha256:x",
        "hashed_files": [],
        "triggers": [],
        "rules": [],
        "concurrency": None,
        "timeout_ms": None,
        "hooks_runs_on": None,
        "hooks": {},
        "jobs": [],
    }
    entry.update(overrides)
    return entry


def test_minimal_lock_is_accepted():
    assert parse_lock(json.dumps(MINIMAL)).schema_version == LOCK_SCHEMA_VERSION


def test_newer_schema_tells_the_user_to_upgrade():
    with pytest.raises(LockSchemaTooNew) as excinfo:
        parse_lock(json.dumps({**MINIMAL, "schema_version": LOCK_SCHEMA_VERSION + 1}))
    assert excinfo.value.code == "lock_schema_too_new"
    assert "upgrade" in excinfo.value.message


def test_older_schema_tells_the_user_to_recompile():
    with pytest.raises(LockSchemaTooOld) as excinfo:
        parse_lock(json.dumps({**MINIMAL, "schema_version": 0}))
    assert "recompile" in excinfo.value.message


def test_unknown_fields_are_lock_invalid():
    with pytest.raises(LockInvalid) as excinfo:
        parse_lock(json.dumps({**MINIMAL, "surprise": True}))
    assert excinfo.value.code == "lock_invalid"


def test_invalid_json_and_oversize_and_missing():
    with pytest.raises(LockInvalidJson):
        parse_lock(b"{not json")
    with pytest.raises(LockTooLarge):
        parse_lock(b" " * (5 * 1024 * 1024 + 1))


def test_missing_file_is_lock_missing(tmp_path):
    with pytest.raises(LockMissing):
        load_lock(tmp_path / "conveyor.lock.json")


@pytest.mark.parametrize(
    "trigger",
    [
        {
            "type": "push",
            "branches": [{"kind": "regex", "pattern": "(a+)+", "flags": "", "negate": False}],
            "paths": [],
        },
        {"type": "schedule", "cron": "not cron", "timezone": "UTC", "inputs": {}},
    ],
)
def test_hand_edited_patterns_and_cron_are_rechecked(trigger):
    with pytest.raises(LockInvalid):
        parse_lock(json.dumps({**MINIMAL, "workflows": [_workflow(triggers=[trigger])]}))


def test_hand_edited_templates_are_rechecked():
    bad = _workflow(concurrency={"group": "{event.nope}", "cancel_in_progress": False, "max": 1})
    with pytest.raises(LockInvalid):
        parse_lock(json.dumps({**MINIMAL, "workflows": [bad]}))


def test_content_hash_is_order_independent_and_prefixed():
    first = content_hash([("b.py", b"x"), ("a.py", b"y")])
    assert first == content_hash([("a.py", b"y"), ("b.py", b"x")])
    assert first.startswith("sha256:")
