"""Fan-out (docs/design/execution.md §13) with real agent processes: a `fanout=True` job runs once on every
connected matching agent and reports one result per host; more matching agents than `max_fanout_hosts` fail it
at queue time with the reason."""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from tests.support.agents import agent_process, job_log
from tests.support.dispatch_stage import Stage, stage
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

WORKFLOW = """
from conveyor import push, workflow

ci = workflow("ci", on=[push(branches=["main"])])


@ci.job(runs_on=["linux"], fanout=True)
def deploy(ctx):
    print("deployed")
"""


def start_agents(s: Stage, tmp_path: Path, stack: ExitStack, count: int) -> None:
    """`count` agent processes matching `linux`, each with a home (so an id) of its own, all connected."""
    for index in range(count):
        stack.enter_context(agent_process(s, tmp_path / f"agent-{index}"))

    def online() -> bool:
        items = s.api("GET", "/agents", params={"limit": 100}).json()["items"]
        return sum(1 for agent in items if agent["state"] == "online") == count

    wait_until(online, timeout=60, what=f"{count} agents online")


def ended_run(s: Stage, run_id: str, timeout: float) -> dict[str, Any]:
    """The run once it ended, whatever its conclusion (the assertions then name each job's status and reason)."""
    ended = ("success", "failed", "cancelled")
    return wait_until(
        lambda: (run := s.run(run_id))["status"] in ended and run, timeout=timeout, what="run end"
    )


def summary(run: dict[str, Any]) -> list[tuple[str, str, str | None]]:
    return [(job["display_name"], job["status"], job["reason"]) for job in run["jobs"]]


def hosts_of(run: dict[str, Any], parent_id: str) -> list[dict[str, Any]]:
    return [job for job in run["jobs"] if job["fanout_parent_id"] == parent_id]


def test_a_fanout_job_runs_once_on_each_of_three_agents_and_reports_three_results(
    database_url: str, tmp_path: Path
) -> None:
    with stage(tmp_path, database_url, {"ci": WORKFLOW}) as s, ExitStack() as agents:
        start_agents(s, tmp_path, agents, 3)
        run_id = s.push()
        run = ended_run(s, run_id, timeout=180)
        assert run["status"] == "success", summary(run)
        deploy = next(job for job in run["jobs"] if job["name"] == "deploy" and job["fanout"])
        hosts = hosts_of(run, deploy["id"])
        logs = {host["fanout_host"]: job_log(s, run_id, host["id"]) for host in hosts}

    assert deploy["status"] == "success"
    assert len(hosts) == 3
    assert len({host["fanout_host"] for host in hosts}) == 3
    for host in hosts:
        assert host["status"] == "success"
        assert host["agent_id"] == host["fanout_host"]
        assert host["display_name"] == f"deploy @ {host['fanout_host']}"
        # Each host's own log, its step's line in it once.
        assert logs[host["fanout_host"]].count("deployed\n") == 1


def test_four_matching_agents_over_max_fanout_hosts_of_three_fail_the_job_at_queue_with_the_reason(
    database_url: str, tmp_path: Path
) -> None:
    with stage(tmp_path, database_url, {"ci": WORKFLOW}) as s, ExitStack() as agents:
        answer = s.api("PATCH", "/cluster-settings", json={"max_fanout_hosts": 3})
        assert answer.status_code == 200, answer.text
        start_agents(s, tmp_path, agents, 4)
        run_id = s.push()
        run = ended_run(s, run_id, timeout=60)

    deploy = next(job for job in run["jobs"] if job["name"] == "deploy")
    assert (run["status"], deploy["status"]) == ("failed", "failed"), summary(run)
    assert deploy["reason"] == "fanout_over_cap: 4 connected agents match [linux]; max_fanout_hosts is 3"
    assert deploy["started_at"] is None  # refused at queue time: nothing ran
    assert hosts_of(run, deploy["id"]) == []
    assert len(run["jobs"]) == 1
