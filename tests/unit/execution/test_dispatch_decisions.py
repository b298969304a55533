"""Pure dispatch decisions: needs verdicts, unschedulable classification, the unroutable grace."""

from datetime import UTC, datetime, timedelta

import pytest

from conveyor.execution.lifecycle import needs_verdict
from conveyor.execution.queue import AgentSlot, agent_can_take
from conveyor.execution.sweeps import classify_pending, pending_note, unroutable_reason

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


NOBODY = "unschedulable: no connected agent or scaler matches [linux]"
SCALER = "waiting: scaler local can start an agent"
WORKER = "waiting: worker w1 can run it when it has room"


@pytest.mark.parametrize(
    ("local", "scaler", "worker", "tried", "expected"),
    [
        ("waiting: 1 matching agent busy", SCALER, WORKER, None, "waiting: 1 matching agent busy"),
        (NOBODY, SCALER, WORKER, None, SCALER),
        (NOBODY, None, WORKER, None, WORKER),
        (NOBODY, None, None, None, NOBODY),
        # Handed back by rerouting: local capacity only, so no worker speaks for it.
        (NOBODY, None, WORKER, ["c1", "w1", "w2"], NOBODY + " (workers tried: w1, w2)"),
        (NOBODY, SCALER, WORKER, ["c1", "w1"], SCALER),
        ("waiting: 2 matching agents busy", None, WORKER, ["c1", "w1"], "waiting: 2 matching agents busy"),
    ],
)
def test_a_pending_note_takes_local_agents_then_scalers_then_workers_never_for_a_handed_back_job(
    local: str, scaler: str | None, worker: str | None, tried: list[str] | None, expected: str
) -> None:
    assert pending_note(local, scaler, worker, tried) == expected


def test_a_handed_back_jobs_unroutable_reason_names_the_workers_tried() -> None:
    note = pending_note(NOBODY, None, WORKER, ["c1", "w1", "w2"])
    reason = unroutable_reason(note, NOW, NOW, timedelta(0))
    assert reason == "unroutable: no connected agent or scaler matches [linux] (workers tried: w1, w2)"
