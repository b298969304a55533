"""Every field of the server's settings is read by some component (the settings twin of the knob-coverage
test), and the declared defaults are the documented ones.

A field that `load_settings` accepts from the YAML file, the environment or a flag but that nothing reads
is a setting an operator sets for nothing: this test fails for any such field.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from conveyor.events.models import EventSettings
from conveyor.server.config import Settings

ROOT = Path(__file__).resolve().parents[3]
SOURCE = ROOT / "src" / "conveyor"
CONFIG = SOURCE / "server" / "config.py"
# `knobs` carries the env/YAML defaults of the fleet and org knobs; the knob-coverage test covers each.
NOT_A_SETTING = {"knobs"}


def _settings_reads() -> dict[str, set[str]]:
    """field name -> modules that read `<something>settings.<field>` (outside the settings module)."""
    reads: dict[str, set[str]] = {}
    for path in SOURCE.rglob("*.py"):
        if path == CONFIG:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Attribute):
                continue
            owner = node.value
            name = owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", "")
            if "settings" in name.lower():
                reads.setdefault(node.attr, set()).add(str(path.relative_to(SOURCE)))
    return reads


def test_every_field_of_the_server_settings_is_read_by_some_component() -> None:
    reads = _settings_reads()
    unread = sorted(set(Settings.model_fields) - NOT_A_SETTING - set(reads))
    assert not unread, f"settings accepted from file, environment or flags but read by nothing: {unread}"


EVENT_FIELDS = {
    "events_lease_seconds": "lease_seconds",
    "events_retry_base_seconds": "retry_base_seconds",
    "events_retry_max_seconds": "retry_max_seconds",
    "events_poll_seconds": "poll_seconds",
    "events_scan_seconds": "scan_seconds",
    "events_cleanup_seconds": "cleanup_seconds",
    "events_concurrency": "concurrency",
    "events_max_chain_depth": "max_chain_depth",
    "events_batch_max_runs": "batch_max_runs",
    "cron_tick_seconds": "cron_tick_seconds",
}


def _documented_event_defaults() -> dict[str, float]:
    """`CONVEYOR_EVENTS_LEASE_SECONDS` (60), `_RETRY_BASE_SECONDS` (5), … of the settings section of docs/events.md."""
    text = (ROOT / "docs/events.md").read_text(encoding="utf-8")
    section = text.split("## Settings and metrics", 1)[1].split("Metrics:", 1)[0]
    found: dict[str, float] = {}
    prefix = ""
    for name, value in re.findall(r"`(CONVEYOR_[A-Z_]+|_[A-Z_]+)`\s*\((\d+)\)", section):
        if name.startswith("CONVEYOR_"):
            prefix = "CONVEYOR_EVENTS" if name.startswith("CONVEYOR_EVENTS_") else ""
            full = name
        else:
            full = prefix + name
        found[full.removeprefix("CONVEYOR_").lower()] = float(value)
    return found


def test_the_event_settings_defaults_are_the_documented_ones_everywhere() -> None:
    documented = _documented_event_defaults()
    assert set(documented) == set(EVENT_FIELDS), sorted(set(documented) ^ set(EVENT_FIELDS))
    plain = EventSettings()
    for field, attribute in EVENT_FIELDS.items():
        assert Settings.model_fields[field].default == documented[field], field
        assert getattr(plain, attribute) == documented[field], attribute
