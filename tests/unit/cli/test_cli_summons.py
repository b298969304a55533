"""`conveyor admin run show` links a summoned run and its summoner both ways (docs/design/execution.md §8.6)."""

from __future__ import annotations

from conveyor.cli.admin.runs import summon_lines


def test_a_summoned_run_names_its_summoner_and_a_summoner_each_run_it_summoned_by_job() -> None:
    parent = {"run_id": "r1", "job_id": "j1", "number": 4, "workflow": "ci"}
    assert summon_lines(parent, [], []) == ["summoned by: run r1 (ci #4), job j1"]
    children = [
        {"run_id": "r2", "number": 1, "workflow": "deploy", "status": "success", "job_id": "j1"},
        {"run_id": "r3", "number": 2, "workflow": "deploy", "status": "running", "job_id": "gone"},
    ]
    jobs = [{"id": "j1", "display_name": "release", "name": "release"}]
    assert summon_lines(None, children, jobs) == [
        "summoned: run r2 (deploy #1) success by job release",
        "summoned: run r3 (deploy #2) running by job gone",
    ]
    assert summon_lines(None, [], jobs) == []
