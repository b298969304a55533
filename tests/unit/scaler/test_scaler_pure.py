"""Pure parts of the manager, the orphan classification and the bare-metal backend."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from conveyor.scaler.backend import LiveItem, LogRing
from conveyor.scaler.bare_metal import agent_environment, cgroup_prefix, forwarded_agent_env, read_tail
from conveyor.scaler.manager import backoff_delay_ms, failure_message
from conveyor.scaler.orphans import Facts, classify, dedupe_ids, stale_coordinators


@pytest.mark.parametrize(
    ("failures", "base", "cap", "expected"),
    [
        (0, 1000, 3000, 0),
        (1, 1000, 3000, 1000),
        (2, 1000, 3000, 2000),
        (3, 1000, 3000, 3000),
        (4, 1000, 3000, 3000),
        (1, 30_000, 900_000, 30_000),
        (5, 30_000, 900_000, 480_000),
        (6, 30_000, 900_000, 900_000),
        (60, 30_000, 900_000, 900_000),
    ],
)
def test_backoff_doubles_up_to_the_maximum(failures: int, base: int, cap: int, expected: int) -> None:
    assert backoff_delay_ms(failures, base, cap) == expected


def test_repeated_failures_are_named_from_the_threshold_on() -> None:
    assert failure_message("exec failed", 4, 5) == "exec failed"
    assert failure_message("exec failed", 5, 5) == "repeated failure (5 in a row): exec failed"
    assert failure_message("exec failed", 7, 5) == "repeated failure (7 in a row): exec failed"


NODE = "node-a"


def item(agent_id: str | None = "a1", node: str | None = NODE) -> LiveItem:
    return LiveItem(
        vm_id=agent_id or "vm",
        kind="process",
        backend="bare-metal",
        backend_ref="1",
        agent_id=agent_id,
        node_marker=node,
    )


def facts(**overrides: object) -> Facts:
    values: dict[str, object] = {
        "node_id": NODE,
        "spawn_ids": frozenset(),
        "bindings": {},
        "online": {},
        "live_nodes": frozenset({NODE}),
        "stale_coordinators": (),
    }
    values.update(overrides)
    return Facts(**values)  # type: ignore[arg-type]


# (item, facts, tracked_by, state)
CLASSIFY = [
    (item(), facts(), (), "untracked"),
    (item(), facts(spawn_ids=frozenset({"a1"})), ("spawn",), "tracked"),
    (item(), facts(bindings={"a1": "job-1"}), ("job",), "tracked"),
    (item(), facts(online={"a1": NODE}), ("registered",), "tracked"),
    (
        item(),
        facts(spawn_ids=frozenset({"a1"}), bindings={"a1": "job-1"}, online={"a1": NODE}),
        ("spawn", "job", "registered"),
        "tracked",
    ),
    # another live node's marker: its owner tracks it
    (item(node="node-b"), facts(live_nodes=frozenset({NODE, "node-b"})), ("spawn",), "tracked"),
    (item(node="node-b"), facts(), (), "untracked"),
    # a stale coordinator anywhere: nothing is untracked
    (item(), facts(stale_coordinators=("node-c",)), (), "unknown"),
    (item(), facts(stale_coordinators=("node-c",), bindings={"a1": "j"}), ("job",), "tracked"),
    # an item without an agent id is only tracked through its node marker
    (item(agent_id=None), facts(spawn_ids=frozenset({"vm"})), (), "untracked"),
    (item(agent_id=None, node=None), facts(), (), "untracked"),
]


@pytest.mark.parametrize(("live", "known", "tracked_by", "state"), CLASSIFY)
def test_classification_table(live: LiveItem, known: Facts, tracked_by: tuple[str, ...], state: str) -> None:
    classified = classify(live, known)
    assert classified.tracked_by == tracked_by
    assert classified.state == state


def test_classification_names_the_job_and_the_coordinator() -> None:
    classified = classify(item(), facts(bindings={"a1": "job-9"}, online={"a1": "node-x"}))
    assert classified.job_id == "job-9" and classified.registered_with == "node-x"
    body = classified.as_json()
    assert body["tracked_by"] == ["job", "registered"] and body["state"] == "tracked"


def test_stale_coordinators_by_heartbeat_age() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    rows = [
        ("fresh", now - timedelta(seconds=5)),
        ("edge", now - timedelta(seconds=30)),
        ("old", now - timedelta(seconds=31)),
    ]
    assert stale_coordinators(rows, now, timedelta(seconds=30)) == (["fresh", "edge"], ["old"])


def test_duplicate_ids_are_merged_in_order() -> None:
    assert dedupe_ids(["b", "a", "b", "c", "a"]) == ["b", "a", "c"]


def test_agent_environment_is_built_from_an_allowlist() -> None:
    parent = {
        "PATH": "/bin",
        "HOME": "/home/u",
        "LC_ALL": "C",
        "LANG": "en",
        "SECRET_TOKEN": "x",
        "CONVEYOR_TOKEN": "cvy_admin_x",
        "CONVEYOR_AGENT_ENV_PIP_INDEX_URL": "https://pypi",
        "AWS_ACCESS_KEY_ID": "k",
    }
    env = agent_environment(parent, {"PATH": "/override", "CONVEYOR_AGENT_TOKEN": "t"})
    assert env == {
        "PATH": "/override",
        "HOME": "/home/u",
        "LC_ALL": "C",
        "LANG": "en",
        "CONVEYOR_AGENT_TOKEN": "t",
    }
    assert forwarded_agent_env(parent) == {"PIP_INDEX_URL": "https://pypi"}
    assert forwarded_agent_env({"CONVEYOR_AGENT_ENV_": "empty name"}) == {}


def test_cgroup_wrapper_only_with_limits() -> None:
    assert cgroup_prefix("a1", None, None) == []
    wrapped = cgroup_prefix("a1", 1.5, 2 * 1024**3)
    assert wrapped[:5] == ["systemd-run", "--user", "--scope", "--quiet", "--unit=conveyor-agent-a1"]
    assert "CPUQuota=150%" in wrapped and f"MemoryMax={2 * 1024**3}" in wrapped and wrapped[-1] == "--"
    assert "CPUQuota=150%" not in cgroup_prefix("a1", None, 1024)


def test_log_tail_keeps_the_last_lines(tmp_path: Path) -> None:
    path = tmp_path / "agent.log"
    assert read_tail(path) == []
    path.write_text("".join(f"line {i}\n" for i in range(500)))
    tail = read_tail(path)
    assert len(tail) == 200 and tail[0] == "line 300" and tail[-1] == "line 499"
    small = read_tail(path, max_lines=1000, max_bytes=30)
    assert small[-1] == "line 499" and all(line.startswith("line ") for line in small)
    ring = LogRing(max_lines=3, max_bytes=1000)
    for i in range(5):
        ring.add(f"l{i}\n")
    assert ring.lines() == ["l2", "l3", "l4"]
