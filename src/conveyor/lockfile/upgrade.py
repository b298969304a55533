"""Pure upgraders from lock schema vN to vN+1, applied stepwise before validation.

Each shape change adds one here: v1→v2 gave every job `container` and `services` (docs/design/containers.md §2).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

LockJson = dict[str, Any]


def v1_to_v2(data: LockJson) -> LockJson:
    """Every job gains `container: null` and `services: {}` (a v1 job ran on the host)."""
    workflows = [
        {**workflow, "jobs": [{**job, "container": None, "services": {}} for job in workflow.get("jobs", [])]}
        for workflow in data.get("workflows", [])
    ]
    return {**data, "workflows": workflows}


UPGRADERS: dict[int, Callable[[LockJson], LockJson]] = {1: v1_to_v2}


def upgrade_lock_json(data: LockJson, *, to_version: int) -> LockJson:
    """Apply `UPGRADERS[v]` for each v from the document's version up to `to_version`."""
    version = data["schema_version"]
    while version < to_version:
        data = UPGRADERS[version](data)
        version += 1
        data["schema_version"] = version
    return data
