"""Artifact names (docs/design/artifacts.md §1): what a name may hold, and a matrix cell's name."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_OUTSIDE_NAME = re.compile(r"[^A-Za-z0-9._]")
MAX_NAME = 128


def name_problem(name: object) -> str | None:
    """Why `name` cannot name an artifact, or None."""
    if not isinstance(name, str) or not NAME_RE.match(name):
        return (
            f"invalid artifact name {str(name)[:80]!r}: 1 to 128 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return None


def cell_name(name: str, matrix: Mapping[str, Any] | None) -> str:
    """The stored name of `name` uploaded by a matrix cell: `name-<values in matrix order>`.

    Each value is cut to the name's characters (anything else becomes `_`); a job without a matrix keeps
    `name`. The result is cut to 128 characters.
    """
    if not matrix:
        return name
    values = [_OUTSIDE_NAME.sub("_", _text(value)) for value in matrix.values()]
    return "-".join([name, *values])[:MAX_NAME]


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
