"""`reroute_entries` and `run show`'s reroutes cell: each ended offer to a worker, named
(docs/design/cluster.md §4.2, §4.4)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from conveyor.cli.admin.runs import describe_reroutes
from conveyor.execution.reroutes import reroute_entries

T0 = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


def row(n: int, agent_id: str | None, outcome: str, reason: str | None, hop: int | None) -> dict[str, Any]:
    return {
        "id": f"h{n}",
        "job_id": "j1",
        "attempt": 1,
        "agent_id": agent_id,
        "outcome": outcome,
        "reason": reason,
        "reroute_hop": hop,
        "detail": f"detail {n}",
        "ended_at": T0 + timedelta(seconds=n),
    }


def test_each_ended_offer_to_a_worker_names_worker_hop_outcome_and_reason_oldest_first() -> None:
    rows = [
        row(2, "worker:w2", "taken_back", "window", 2),
        row(1, "worker:w1", "rejected", "no-capacity", 1),
    ]
    assert [(e["worker"], e["hop"], e["outcome"], e["reason"]) for e in reroute_entries(rows)] == [
        ("w1", 1, "rejected", "no-capacity"),
        ("w2", 2, "taken_back", "window"),
    ]


def test_a_local_agent_s_history_is_not_a_reroute() -> None:
    assert (
        reroute_entries([row(1, "agent-7", "rejected", None, None), row(2, None, "expired", None, None)])
        == []
    )


def test_a_row_from_before_reasons_were_recorded_names_what_its_outcome_says() -> None:
    (timed_out, refused) = reroute_entries(
        [row(1, "worker:w1", "ack_timeout", None, None), row(2, "worker:w2", "rejected", None, None)]
    )
    assert (timed_out["reason"], timed_out["hop"]) == ("ack-timeout", None)
    assert refused["reason"] is None


def test_run_show_names_the_worker_the_hop_the_workers_tried_and_each_re_dispatch() -> None:
    job = {
        "rerouted_to": "w3",
        "reroute_hop": 3,
        "reroute_tried": ["c1", "w1", "w2"],
        "reroutes": [
            {"worker": "w1", "hop": 1, "outcome": "ack_timeout", "reason": "ack-timeout"},
            {"worker": "w2", "hop": 2, "outcome": "taken_back", "reason": "cap"},
        ],
    }
    assert describe_reroutes(job) == (
        "on w3 hop 3; tried w1, w2; w1 hop 1: ack_timeout (ack-timeout); w2 hop 2: taken_back (cap)"
    )


def test_run_show_leaves_the_cell_empty_for_a_job_never_rerouted() -> None:
    assert (
        describe_reroutes({"rerouted_to": None, "reroute_hop": None, "reroute_tried": None, "reroutes": []})
        == ""
    )
