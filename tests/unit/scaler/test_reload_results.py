"""The per-node answers of `scaler reload --target` and how they add up (docs/design/scaler.md §3.1)."""

from __future__ import annotations

import asyncio
from typing import Any

from conveyor.scaler.config import ScalerConfigError
from conveyor.scaler.manager import ReloadInProgress
from conveyor.scaler.reload_results import node_result, reload_here, summarise


class Manager:
    def __init__(self, outcome: Exception | dict[str, Any]) -> None:
        self.outcome = outcome

    async def reload(self) -> dict[str, Any]:
        if isinstance(self.outcome, Exception):
            raise self.outcome
        return self.outcome


def test_an_applied_reload_is_reloaded_with_the_scalers_it_runs() -> None:
    result = asyncio.run(reload_here(Manager({"applied": True, "scalers": ["a", "b"]}), "c1", "coordinator"))
    assert result == {
        "node": "c1",
        "role": "coordinator",
        "outcome": "reloaded",
        "detail": "applied: a, b",
        "scalers": ["a", "b"],
    }


def test_a_config_error_is_refused_with_every_problem_and_the_config_kept() -> None:
    error = ScalerConfigError(["x.yaml: scalers[a].max_agents: not a number", "x.yaml: duplicate label set"])
    result = asyncio.run(reload_here(Manager(error), "w1", "worker"))
    assert result["outcome"] == "refused" and "scalers" not in result
    assert result["detail"] == (
        "x.yaml: scalers[a].max_agents: not a number; x.yaml: duplicate label set; "
        "the running configuration was kept"
    )


def test_a_reload_in_progress_is_refused_not_raised() -> None:
    result = asyncio.run(
        reload_here(Manager(ReloadInProgress("a scaler reload is already in progress")), "w1", "worker")
    )
    assert result["outcome"] == "refused" and result["detail"].startswith("a scaler reload is already")


def test_the_summary_puts_this_node_first_then_the_others_by_id_and_counts_every_outcome() -> None:
    results = [
        node_result("w2", "worker", "unreachable", "no answer within 1 s"),
        node_result("c2", "coordinator", "refused", "bad"),
        node_result("c1", "coordinator", "reloaded", "applied: x", ["x"]),
        node_result("a0", "worker", "reloaded", "applied: no scalers", []),
    ]
    summary = summarise("all", "c1", results)
    assert [r["node"] for r in summary["results"]] == ["c1", "a0", "c2", "w2"]
    assert (summary["target"], summary["reloaded"], summary["refused"], summary["unreachable"]) == (
        "all",
        2,
        1,
        1,
    )


def test_an_empty_summary_still_names_each_count() -> None:
    assert summarise("c9", "c1", []) == {
        "target": "c9",
        "results": [],
        "reloaded": 0,
        "refused": 0,
        "unreachable": 0,
    }
