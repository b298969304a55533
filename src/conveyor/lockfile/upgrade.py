"""Pure upgraders from lock schema vN to vN+1, applied stepwise before validation.

Schema v1 is the first version, so there are no upgraders yet; each future shape change adds one here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

LockJson = dict[str, Any]

UPGRADERS: dict[int, Callable[[LockJson], LockJson]] = {}


def upgrade_lock_json(data: LockJson, *, to_version: int) -> LockJson:
    """Apply `UPGRADERS[v]` for each v from the document's version up to `to_version`."""
    version = data["schema_version"]
    while version < to_version:
        data = UPGRADERS[version](data)
        version += 1
        data["schema_version"] = version
    return data
