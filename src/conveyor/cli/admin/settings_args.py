"""Parsing `KEY=VALUE` arguments of the settings verbs (`cluster-settings set`, `org-settings set`)."""

from __future__ import annotations

from collections.abc import Sequence

from conveyor.cli.admin.client import EXIT_USAGE, fail


def parse_assignments(pairs: Sequence[str]) -> dict[str, object]:
    """`["a=1", "b=x"]` → `{"a": 1, "b": "x"}`; a non-integer is sent as is so the server names the error."""
    if not pairs:
        fail("give at least one KEY=VALUE", EXIT_USAGE)
    body: dict[str, object] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            fail(f"{pair!r} is not KEY=VALUE", EXIT_USAGE)
        raw = value.strip()
        try:
            body[key.strip()] = int(raw)
        except ValueError:
            body[key.strip()] = raw
    return body


def parse_keys(keys: Sequence[str]) -> dict[str, object]:
    """`["a", "b"]` → `{"a": None, "b": None}` (a PATCH with null clears)."""
    if not keys:
        fail("give at least one KEY", EXIT_USAGE)
    return dict.fromkeys((k.strip() for k in keys), None)
