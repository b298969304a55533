"""How a step's cache outcome reads on the run page and in `admin run show` (docs/design/caches.md §7):
every combination of the lookup's kind and the save's outcome."""

from __future__ import annotations

from typing import Any

import pytest

from conveyor.cli.admin.runs import cache_lines
from conveyor.model.caches import step_cache_text


def record(kind: str | None, saved: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"key": "deps-2", "kind": kind, "restored_key": None, "saved": saved, "saved_size": None, **extra}


@pytest.mark.parametrize(
    ("found", "shown"),
    [
        (record("exact", restored_key="deps-2"), "deps-2: exact hit"),
        # An exact hit saves nothing; were a save recorded all the same, the hit is what the step did.
        (record("exact", "saved", saved_size=3), "deps-2: exact hit"),
        (record("miss", "saved", saved_size=2048), "deps-2: miss, saved 2.0 KiB"),
        (record("miss", "saved"), "deps-2: miss, saved"),
        (record("miss"), "deps-2: miss, not saved"),
        (record("miss", "dropped"), "deps-2: miss, not saved (the key exists)"),
        (
            record("partial", "saved", restored_key="deps-1", saved_size=10),
            "deps-2: partial hit (deps-1), saved 10 B",
        ),
        (record("partial", restored_key="deps-1"), "deps-2: partial hit (deps-1), not saved"),
        (
            record("partial", "dropped", restored_key="deps-1"),
            "deps-2: partial hit (deps-1), not saved (the key exists)",
        ),
        (record(None, "saved", saved_size=1), "deps-2: not looked up, saved 1 B"),
        (record(None, "dropped"), "deps-2: not looked up, not saved (the key exists)"),
        (record(None), "deps-2: not looked up, not saved"),
    ],
)
def test_step_cache_text(found: dict[str, Any], shown: str) -> None:
    assert step_cache_text(found) == shown


def test_cache_lines_name_the_job_and_step_of_each_record() -> None:
    jobs = [
        {
            "display_name": "build (3.12)",
            "steps": [
                {"name": "install", "caches": [record("miss", "saved", saved_size=5), record("exact")]},
                {"name": "test", "caches": []},
            ],
        },
        {"name": "lint", "steps": [{"name": "ruff"}]},
    ]
    assert cache_lines(jobs) == [
        "  build (3.12) / install: deps-2: miss, saved 5 B",
        "  build (3.12) / install: deps-2: exact hit",
    ]
