"""Pure reroute decisions (docs/design/cluster.md §4): which worker, the worker's answer, NAK backoff, flap
grace."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from conveyor.cluster.messages import AgentInventory, ScalerInventory
from conveyor.cluster.reroute import (
    NakBackoff,
    RerouteAnswer,
    SpawnFailureVerdict,
    WorkerCapacity,
    WorkerView,
    choose_worker,
    nak_backoff_ms,
    on_relayed_spawn_failure,
    reroute_answer,
    spoken_for,
    within_flap_grace,
    worker_capacity,
    worker_wait_note,
)


def runs_on(*labels: str, exclude: tuple[str, ...] = ()) -> dict[str, Any]:
    def matcher(text: str) -> dict[str, str]:
        return {"kind": "exact", "pattern": text, "flags": ""}

    return {"labels": [matcher(x) for x in labels], "exclude": [matcher(x) for x in exclude]}


def agent(
    agent_id: str, *labels: str, capacity: int = 1, active: int = 0, mandatory: tuple[str, ...] = ()
) -> AgentInventory:
    return AgentInventory(
        agent_id=agent_id,
        labels=list(labels),
        mandatory_labels=list(mandatory),
        capacity=capacity,
        active_jobs=active,
    )


def scaler(*label_sets: tuple[str, ...], max_agents: int = 2, active: int = 0) -> ScalerInventory:
    return ScalerInventory(
        name="local",
        backend="bare-metal",
        label_sets=[list(s) for s in label_sets],
        max_agents=max_agents,
        active=active,
    )


def worker(
    instance_id: str,
    *,
    agents: tuple[AgentInventory, ...] = (),
    scalers: tuple[ScalerInventory, ...] = (),
    connected: bool = True,
    draining: bool = False,
) -> WorkerView:
    return WorkerView(instance_id, connected, draining, agents, scalers)


def test_a_worker_with_a_matching_scaler_is_chosen() -> None:
    workers = [worker("w1", scalers=(scaler(("linux",)),))]
    assert choose_worker(runs_on("linux"), workers) == "w1"


def test_no_matching_capacity_means_no_worker() -> None:
    workers = [
        worker("w1", scalers=(scaler(("macos",)),)),
        worker("w2", agents=(agent("a", "linux", capacity=1, active=1),)),
        worker("w3", scalers=(scaler(("linux",), max_agents=1, active=1),)),
    ]
    assert choose_worker(runs_on("linux"), workers) is None


def test_free_agent_slots_beat_scaler_room_then_instance_id_breaks_ties() -> None:
    workers = [
        worker("w1", scalers=(scaler(("linux",), max_agents=10),)),
        worker("w3", agents=(agent("a", "linux"),)),
        worker("w2", agents=(agent("b", "linux"),)),
    ]
    assert choose_worker(runs_on("linux"), workers) == "w2"


def test_more_scaler_room_wins_when_no_agent_is_free() -> None:
    workers = [
        worker("w1", scalers=(scaler(("linux",), max_agents=2),)),
        worker("w2", scalers=(scaler(("linux",), max_agents=5),)),
    ]
    assert choose_worker(runs_on("linux"), workers) == "w2"


@pytest.mark.parametrize(
    "excluded",
    [
        {"connected": False},
        {"draining": True},
    ],
)
def test_disconnected_or_draining_workers_are_not_candidates(excluded: dict[str, bool]) -> None:
    workers = [worker("w1", scalers=(scaler(("linux",)),), **excluded)]
    assert choose_worker(runs_on("linux"), workers) is None


def test_tried_and_backing_off_workers_are_skipped() -> None:
    workers = [worker(w, scalers=(scaler(("linux",)),)) for w in ("w1", "w2", "w3")]
    assert choose_worker(runs_on("linux"), workers, tried=["w1"], backing_off=["w2"]) == "w3"


def test_mandatory_and_excluded_labels_follow_the_dispatch_rule() -> None:
    gpu_only = worker("w1", agents=(agent("a", "linux", "gpu", mandatory=("gpu",)),))
    assert choose_worker(runs_on("linux"), [gpu_only]) is None
    assert choose_worker(runs_on("linux", "gpu"), [gpu_only]) == "w1"
    assert choose_worker(runs_on("linux", exclude=("gpu",)), [gpu_only]) is None


def test_capacity_counts_only_matching_free_slots() -> None:
    view = worker(
        "w1",
        agents=(agent("a", "linux", capacity=3, active=1), agent("b", "macos")),
        scalers=(scaler(("linux",), max_agents=4, active=1),),
    )
    capacity = worker_capacity(runs_on("linux"), view)
    assert (capacity.agent_slots, capacity.scaler_room) == (2, 3)


def test_a_host_pinned_job_never_counts_scaler_room() -> None:
    view = worker(
        "w1",
        scalers=(
            scaler(
                ("linux", "conveyor:host:box"),
            ),
        ),
    )
    assert worker_capacity(runs_on("conveyor:host:box"), view).scaler_room == 0


LINUX_SCALER = (scaler(("linux",)),)
LINUX_AGENT = (agent("a", "linux"),)

# One row per rule of docs/design/cluster.md §4.1: (case, workers, choose_worker keywords, expected worker).
CHOICES: list[tuple[str, list[WorkerView], dict[str, Any], str | None]] = [
    ("no worker at all", [], {}, None),
    ("a free matching agent", [worker("w1", agents=LINUX_AGENT)], {}, "w1"),
    ("free matching scaler room", [worker("w1", scalers=LINUX_SCALER)], {}, "w1"),
    ("disconnected", [worker("w1", agents=LINUX_AGENT, connected=False)], {}, None),
    ("draining", [worker("w1", agents=LINUX_AGENT, draining=True)], {}, None),
    ("tried", [worker("w1", agents=LINUX_AGENT)], {"tried": ["c1", "w1"]}, None),
    ("backing off", [worker("w1", agents=LINUX_AGENT)], {"backing_off": ["w1"]}, None),
    ("its only agent is busy", [worker("w1", agents=(agent("a", "linux", active=1),))], {}, None),
    ("its scaler is full", [worker("w1", scalers=(scaler(("linux",), max_agents=1, active=1),))], {}, None),
    (
        "labels do not match",
        [worker("w1", agents=(agent("a", "macos"),), scalers=(scaler(("macos",)),))],
        {},
        None,
    ),
    ("an excluded label", [worker("w1", agents=(agent("a", "linux", "gpu"),))], {"exclude": ("gpu",)}, None),
    (
        "a mandatory label the job does not name",
        [worker("w1", agents=(agent("a", "linux", "gpu", mandatory=("gpu",)),))],
        {},
        None,
    ),
    (
        "a mandatory scaler label the job does not name",
        [
            worker(
                "w1",
                scalers=(
                    ScalerInventory(
                        name="gpu",
                        backend="bare-metal",
                        label_sets=[["linux", "gpu"]],
                        mandatory_labels=["gpu"],
                        max_agents=2,
                        active=0,
                    ),
                ),
            )
        ],
        {},
        None,
    ),
    (
        "more free agent slots first",
        [
            worker("w1", agents=(agent("a", "linux"),)),
            worker("w2", agents=(agent("b", "linux", capacity=2),)),
        ],
        {},
        "w2",
    ),
    (
        "any free agent slot beats any scaler room",
        [worker("w1", scalers=(scaler(("linux",), max_agents=9),)), worker("w2", agents=LINUX_AGENT)],
        {},
        "w2",
    ),
    (
        "then more scaler room",
        [
            worker("w1", scalers=(scaler(("linux",), max_agents=2),)),
            worker("w2", scalers=(scaler(("linux",), max_agents=3),)),
        ],
        {},
        "w2",
    ),
    (
        "then the lower instance id",
        [worker("w2", agents=LINUX_AGENT), worker("w1", agents=LINUX_AGENT)],
        {},
        "w1",
    ),
    (
        "only matching slots count toward the order",
        [
            worker("w1", agents=(agent("a", "linux"), agent("b", "macos"), agent("c", "macos"))),
            worker("w2", agents=(agent("d", "linux", capacity=2),)),
        ],
        {},
        "w2",
    ),
    (
        "an excluded better worker leaves the next one",
        [
            worker("w1", agents=(agent("a", "linux", capacity=3),)),
            worker("w2", agents=(agent("b", "linux", capacity=2),), draining=True),
            worker("w3", agents=LINUX_AGENT),
        ],
        {"tried": ["c1", "w1"]},
        "w3",
    ),
    (
        "offers in flight use up its agent slot",
        [worker("w1", agents=LINUX_AGENT)],
        {"in_flight": {"w1": 1}},
        None,
    ),
    (
        "offers in flight take agent slots before scaler room",
        [
            worker("w1", agents=LINUX_AGENT, scalers=(scaler(("linux",), max_agents=1),)),
            worker("w2", scalers=(scaler(("linux",), max_agents=2),)),
        ],
        {"in_flight": {"w1": 1}},
        "w2",
    ),
    (
        "offers in flight to another worker do not count",
        [worker("w1", agents=LINUX_AGENT)],
        {"in_flight": {"w2": 5}},
        "w1",
    ),
]


@pytest.mark.parametrize(
    ("workers", "keywords", "expected"),
    [case[1:] for case in CHOICES],
    ids=[case[0] for case in CHOICES],
)
def test_choose_worker_follows_the_candidate_and_order_rules(
    workers: list[WorkerView], keywords: dict[str, Any], expected: str | None
) -> None:
    keywords = dict(keywords)
    exclude = keywords.pop("exclude", ())
    assert choose_worker(runs_on("linux", exclude=exclude), workers, **keywords) == expected


@pytest.mark.parametrize(
    ("slots", "room", "offers", "left"),
    [(2, 3, 0, (2, 3)), (2, 3, 1, (1, 3)), (2, 3, 3, (0, 2)), (2, 3, 9, (0, 0)), (0, 1, -1, (0, 1))],
)
def test_offers_in_flight_speak_for_agent_slots_then_scaler_room(
    slots: int, room: int, offers: int, left: tuple[int, int]
) -> None:
    capacity = spoken_for(WorkerCapacity("w1", slots, room), offers)
    assert (capacity.agent_slots, capacity.scaler_room) == left


@pytest.mark.parametrize(
    ("naks", "expected"), [(0, 0), (1, 2000), (2, 4000), (5, 32000), (6, 60000), (60, 60000)]
)
def test_nak_backoff_doubles_up_to_a_minute(naks: int, expected: int) -> None:
    assert nak_backoff_ms(naks) == expected


def test_nak_backoff_expires_and_an_ack_resets_it() -> None:
    backoff = NakBackoff()
    backoff.nak("w1", now=100.0)
    assert backoff.backing_off(100.5) == {"w1"}
    assert backoff.backing_off(102.5) == set()
    backoff.nak("w1", now=103.0)
    assert backoff.backing_off(106.0) == {"w1"}  # two in a row: 4 s
    backoff.ack("w1")
    assert backoff.backing_off(106.0) == set()


def answer(**overrides: Any) -> RerouteAnswer:
    values: dict[str, Any] = {
        "me": "w1",
        "hop": 1,
        "max_hops": 3,
        "tried": ["c1"],
        "held": False,
        "draining": False,
        "has_capacity": True,
    }
    values.update(overrides)
    return reroute_answer(**values)


def test_an_offer_with_capacity_is_accepted() -> None:
    assert answer() == RerouteAnswer(True)


def test_the_last_allowed_hop_is_accepted() -> None:
    assert answer(hop=3, max_hops=3, tried=["c1", "w2", "w3"]) == RerouteAnswer(True)


def test_a_resent_offer_of_a_held_job_is_a_duplicate_even_while_draining() -> None:
    assert answer(held=True, draining=True) == RerouteAnswer(True, duplicate=True)


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"valid": False, "held": True}, "invalid"),
        ({"tried": ["c1", "w1"]}, "loop"),
        ({"hop": 4}, "max-hops"),
        ({"draining": True, "has_capacity": False}, "draining"),
        ({"has_capacity": False}, "no-capacity"),
    ],
)
def test_naks_name_their_reason(overrides: dict[str, Any], reason: str) -> None:
    assert answer(**overrides) == RerouteAnswer(False, reason=reason)


def test_a_connected_worker_is_always_within_flap_grace() -> None:
    assert within_flap_grace(connected=True, last_heard_age_ms=None, flap_grace_ms=1000)


def test_a_disconnected_worker_is_within_grace_only_until_it_lapses() -> None:
    assert within_flap_grace(connected=False, last_heard_age_ms=1000, flap_grace_ms=1000)
    assert not within_flap_grace(connected=False, last_heard_age_ms=1001, flap_grace_ms=1000)


def test_a_worker_never_heard_from_gets_no_grace() -> None:
    assert not within_flap_grace(connected=False, last_heard_age_ms=None, flap_grace_ms=120_000)


def test_capacity_units_are_free_agent_slots_and_scaler_label_sets_with_room() -> None:
    from conveyor.cluster.reroute import capacity_units

    view = worker(
        "w1",
        agents=(agent("a", "linux", capacity=2, active=1), agent("b", "linux", capacity=1, active=1)),
        scalers=(
            scaler(("linux",), ("linux", "docker"), max_agents=3, active=1),
            scaler(("macos",), max_agents=1, active=1),
        ),
    )
    units = capacity_units(view)
    assert [(u.key, u.labels, u.free) for u in units] == [
        ("w1/agent/a", ("linux",), 1),
        ("w1/scaler/local/0", ("linux",), 2),
        ("w1/scaler/local/1", ("linux", "docker"), 2),
    ]


def test_a_worker_can_serve_a_job_its_busy_agents_or_full_scalers_match() -> None:
    from conveyor.cluster.reroute import worker_can_serve

    busy = worker("w1", agents=(agent("a", "linux", capacity=1, active=1),))
    full = worker("w2", scalers=(scaler(("linux",), max_agents=1, active=1),))
    other = worker("w3", agents=(agent("b", "macos"),), scalers=(scaler(("windows",)),))
    assert worker_can_serve(runs_on("linux"), busy) and worker_can_serve(runs_on("linux"), full)
    assert not worker_can_serve(runs_on("linux"), other)
    assert not worker_can_serve(
        runs_on("conveyor:host:x"), worker("w4", scalers=(scaler(("conveyor:host:x",)),))
    )


def test_a_waiting_note_names_a_worker_that_will_run_the_job_before_one_that_drains() -> None:
    linux = (scaler(("linux",)),)
    draining = worker("w1", scalers=linux, draining=True)
    ready = worker("w2", scalers=linux)
    assert (
        worker_wait_note(runs_on("linux"), [draining, ready])
        == "waiting: worker w2 can run it when it has room"
    )
    assert (
        worker_wait_note(runs_on("linux"), [draining]) == "unschedulable: worker w1 matches but is draining"
    )
    also = worker("w0", agents=(agent("a", "linux"),), draining=True)
    assert (
        worker_wait_note(runs_on("linux"), [draining, also])
        == "unschedulable: worker w0 matches but is draining"
    )


def test_disconnected_or_unmatching_workers_have_no_say() -> None:
    gone = worker("w1", scalers=(scaler(("linux",)),), connected=False)
    other = worker("w2", scalers=(scaler(("macos",)),), draining=True)
    assert worker_wait_note(runs_on("linux"), [gone, other]) is None
    assert worker_wait_note(runs_on("linux"), []) is None


# --- Layer B: a relayed spawn failure (docs/design/cluster.md §4.3)

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
ARMED = NOW + timedelta(seconds=30)


def relayed(**overrides: Any) -> SpawnFailureVerdict:
    values: dict[str, Any] = {
        "sender": "w1",
        "holder": "w1",
        "status": "dispatched",
        "window_expires_at": ARMED,
        "final": False,
        "failures": 0,
        "max_attempts": 3,
        "backoff_ms": 5000,
        "spawn_window_ms": 90_000,
        "now": NOW,
    }
    values.update(overrides)
    return on_relayed_spawn_failure(**values)


@pytest.mark.parametrize(
    ("case", "overrides", "expected"),
    [
        ("from another peer, final", {"sender": "w2", "final": True}, SpawnFailureVerdict("ignore")),
        ("from another peer, not final", {"sender": "w2"}, SpawnFailureVerdict("ignore")),
        ("for a job no worker holds", {"holder": None, "final": True}, SpawnFailureVerdict("ignore")),
        (
            "window not armed (started)",
            {"window_expires_at": None, "final": True},
            SpawnFailureVerdict("persist"),
        ),
        ("job already running", {"status": "running", "final": True}, SpawnFailureVerdict("persist")),
        ("job already ended", {"status": "cancelled", "final": True}, SpawnFailureVerdict("persist")),
        ("final: true", {"final": True}, SpawnFailureVerdict("redispatch", reason="final")),
        (
            "final: true, a queued job",
            {"final": True, "status": "queued"},
            SpawnFailureVerdict("redispatch", reason="final"),
        ),
        ("no final: recorded only", {"final": None}, SpawnFailureVerdict("persist")),
        (
            "no final, past the budget: still recorded only",
            {"final": None, "failures": 9},
            SpawnFailureVerdict("persist"),
        ),
        (
            "final: false re-arms for one more attempt plus the backoff",
            {},
            SpawnFailureVerdict("rearm", failures=1, window_expires_at=NOW + timedelta(milliseconds=95_000)),
        ),
        (
            "final: false below the budget",
            {"failures": 1},
            SpawnFailureVerdict("rearm", failures=2, window_expires_at=NOW + timedelta(milliseconds=95_000)),
        ),
        (
            "the max-attempts-th failure counts as final",
            {"failures": 2},
            SpawnFailureVerdict("redispatch", failures=3, reason="cap"),
        ),
        (
            "a budget of one: the first failure is final",
            {"max_attempts": 1},
            SpawnFailureVerdict("redispatch", failures=1, reason="cap"),
        ),
        (
            "a zero backoff re-arms for one window",
            {"backoff_ms": 0, "spawn_window_ms": 10_000},
            SpawnFailureVerdict("rearm", failures=1, window_expires_at=NOW + timedelta(seconds=10)),
        ),
    ],
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_a_relayed_spawn_failure_follows_the_layer_b_table(
    case: str, overrides: dict[str, Any], expected: SpawnFailureVerdict
) -> None:
    assert relayed(**overrides) == expected
