"""Fan-out's pure decisions (docs/design/execution.md §13): which agents are the hosts, and the job's result."""

from __future__ import annotations

import pytest

from conveyor.execution.fanout import (
    FanoutRefusal,
    HostEnd,
    fanout_result,
    pinned_runs_on,
    select_fanout_hosts,
)
from conveyor.execution.queue_match import AgentSlot, agent_can_take, claim_labels

LINUX = {"labels": [{"kind": "exact", "pattern": "linux", "flags": ""}], "exclude": []}


def agent(agent_id: str, *labels: str, mandatory: tuple[str, ...] = ()) -> AgentSlot:
    return AgentSlot(agent_id, labels, mandatory)


def test_every_matching_agent_is_a_host_in_agent_id_order_and_the_others_are_not() -> None:
    candidates = [agent("c", "linux"), agent("a", "linux", "gpu"), agent("b", "macos"), agent("d", "linux")]
    assert select_fanout_hosts(LINUX, candidates, cap=3) == ("a", "c", "d")


def test_an_agent_whose_mandatory_labels_the_job_does_not_name_is_not_a_host() -> None:
    candidates = [agent("a", "linux"), agent("b", "linux", "prod", mandatory=("prod",))]
    assert select_fanout_hosts(LINUX, candidates, cap=10) == ("a",)


def test_more_matching_agents_than_the_cap_refuse_the_job_with_the_reason() -> None:
    candidates = [agent(name, "linux") for name in "abcd"]
    assert select_fanout_hosts(LINUX, candidates, cap=3) == FanoutRefusal(
        "fanout_over_cap: 4 connected agents match [linux]; max_fanout_hosts is 3"
    )
    assert select_fanout_hosts(LINUX, candidates, cap=4) == ("a", "b", "c", "d")


def test_no_matching_agent_refuses_the_job() -> None:
    assert select_fanout_hosts(LINUX, [agent("a", "macos")], cap=3) == FanoutRefusal(
        "fanout_no_hosts: no connected agent matches [linux]"
    )


def test_a_pinned_row_is_for_its_agent_alone() -> None:
    pinned = pinned_runs_on(LINUX, "a")
    assert agent_can_take(pinned, agent("a", "linux"))
    assert not agent_can_take(pinned, agent("b", "linux"))
    assert not agent_can_take(pinned, agent("a", "macos"))
    # PostgreSQL's pre-filter: the pinned agent's claim labels hold its pin, another's do not.
    assert "conveyor:agent:a" in claim_labels(agent("a", "linux"))
    assert "conveyor:agent:a" not in claim_labels(agent("b", "linux"))


def ends(*statuses: str) -> list[HostEnd]:
    return [
        HostEnd(f"h{index}", status, None if status == "success" else "step_failed")
        for index, status in enumerate(statuses)
    ]


def test_the_job_succeeds_only_when_every_host_succeeded() -> None:
    assert fanout_result(ends("success", "success", "success")) == ("success", None)
    assert fanout_result(ends("success", "skipped")) == ("success", None)


def test_one_failed_or_timed_out_host_fails_the_job_naming_each() -> None:
    assert fanout_result(ends("success", "failed", "timed_out")) == (
        "failed",
        "fanout: 2 of 3 hosts failed (h1: step_failed; h2: step_failed)",
    )
    assert fanout_result([HostEnd("a", "failed", "agent_lost"), HostEnd("b", "cancelled", None)]) == (
        "failed",
        "fanout: 1 of 2 hosts failed (a: agent_lost)",
    )


def test_a_cancelled_host_without_a_failed_one_cancels_the_job() -> None:
    assert fanout_result(ends("success", "cancelled")) == ("cancelled", "fanout: a host was cancelled")


@pytest.mark.parametrize("running", ["queued", "dispatched", "running", "recovering", "cancelling"])
def test_no_result_while_a_host_has_not_ended(running: str) -> None:
    assert fanout_result(ends("success", running)) is None
    assert fanout_result([]) is None
