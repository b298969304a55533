"""Pure dispatch decisions: needs verdicts, unschedulable classification, the unroutable grace."""

from datetime import UTC, datetime, timedelta

import pytest

from conveyor.execution.lifecycle import needs_verdict
from conveyor.execution.queue import AgentSlot, agent_can_take
from conveyor.execution.sweeps import classify_pending, unroutable_reason

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
LINUX = {"labels": [{"kind": "exact", "pattern": "linux", "flags": ""}], "exclude": []}
GPU = {
    "labels": [
        {"kind": "exact", "pattern": "gpu", "flags": ""},
        {"kind": "exact", "pattern": "linux", "flags": ""},
    ],
    "exclude": [],
}


@pytest.mark.parametrize(
    ("edges", "statuses", "expected"),
    [
        ([("build", ["success"])], {"build": ["success"]}, "ready"),
        ([("build", ["success"])], {"build": ["failed"]}, "needs: build failed"),
        (
            [("build", ["success", "failed", "cancelled", "skipped", "timed_out"])],
            {"build": ["failed"]},
            "ready",
        ),
        ([("build", ["success"])], {"build": ["success", "running"]}, None),
        ([("build", ["success"])], {"build": ["success", "failed"]}, "needs: build failed"),
        ([("a", ["success"]), ("b", ["success"])], {"a": ["success"], "b": ["skipped"]}, "needs: b skipped"),
        ([], {}, "ready"),
    ],
)
def test_needs_verdict(
    edges: list[tuple[str, list[str]]], statuses: dict[str, list[str]], expected: str | None
) -> None:
    assert needs_verdict(edges, statuses) == expected


def test_mandatory_labels_must_be_named_by_the_job() -> None:
    picky = AgentSlot("a", ("linux", "gpu"), ("gpu",))
    assert agent_can_take(GPU, picky)
    assert not agent_can_take(LINUX, picky)


def test_classification_names_the_labels_or_counts_busy_agents() -> None:
    online = [AgentSlot("a", ("linux",), ()), AgentSlot("b", ("linux",), ())]
    assert (
        classify_pending(GPU, online, set())
        == "unschedulable: no connected agent or scaler matches [gpu, linux]"
    )
    assert classify_pending(LINUX, online, set()) == "waiting: 2 matching agents busy"
    assert classify_pending(LINUX, online, {"a", "b"}) == "unschedulable: every matching agent is draining"


@pytest.mark.parametrize(
    ("note", "since", "grace_s", "expected"),
    [
        ("waiting: 1 matching agent busy", NOW - timedelta(hours=1), 10, None),
        ("unschedulable: nothing matches [gpu]", None, 10, None),
        ("unschedulable: nothing matches [gpu]", NOW - timedelta(seconds=9), 10, None),
        (
            "unschedulable: nothing matches [gpu]",
            NOW - timedelta(seconds=10),
            10,
            "unroutable: nothing matches [gpu]",
        ),
        ("unschedulable: nothing matches [gpu]", None, 0, "unroutable: nothing matches [gpu]"),
    ],
)
def test_unroutable_after_the_grace(
    note: str, since: datetime | None, grace_s: int, expected: str | None
) -> None:
    assert unroutable_reason(note, since, NOW, timedelta(seconds=grace_s)) == expected
