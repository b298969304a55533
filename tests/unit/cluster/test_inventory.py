"""What a node's heartbeat says about its agents and scalers (docs/design/cluster.md §2.3)."""

from __future__ import annotations

from dataclasses import dataclass, field

from conveyor.cluster.inventory import agent_inventory, scaler_inventory


@dataclass
class Agent:
    agent_id: str
    labels: tuple[str, ...] = ("linux",)
    mandatory_labels: tuple[str, ...] = ()
    capacity: int = 1
    jobs: set[str] = field(default_factory=set)
    closed: bool = False


def test_open_agents_are_listed_in_id_order_with_their_load() -> None:
    agents = [
        Agent("b", labels=("Linux", "X64"), capacity=4, jobs={"j1", "j2"}),
        Agent("a", mandatory_labels=("GPU",)),
        Agent("c", closed=True),
    ]
    listed = agent_inventory(agents)
    assert [entry.agent_id for entry in listed] == ["a", "b"]
    assert listed[1].labels == ["linux", "x64"] and listed[1].capacity == 4 and listed[1].active_jobs == 2
    assert listed[0].mandatory_labels == ["gpu"] and listed[0].active_jobs == 0


def test_scalers_but_retiring_ones_are_listed_with_capacity() -> None:
    status = [
        {
            "name": "local",
            "type": "bare-metal",
            "state": "active",
            "max_agents": 2,
            "active": 1,
            "label_sets": [["Linux"], ["linux", "docker"]],
            "mandatory_labels": [],
        },
        {"name": "old", "type": "container", "state": "retiring", "max_agents": 5, "active": 0},
        {"name": "broken", "type": "firecracker", "state": "failing", "max_agents": 1, "active": 0},
    ]
    listed = scaler_inventory(status)
    assert [(s.name, s.backend) for s in listed] == [("local", "bare-metal"), ("broken", "firecracker")]
    assert listed[0].label_sets == [["linux"], ["linux", "docker"]]
    assert (listed[0].max_agents, listed[0].active) == (2, 1)
    assert listed[1].label_sets == []
