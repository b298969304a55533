"""The scaler manager's pure parts: provision backoff on a scaler's runtime, and the status it shows."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import cast

from conveyor.scaler.backend import LabelSetSpec, ScalerBackend, ScalerEntry
from conveyor.scaler.manager import AgentView, ScalerRuntime, Spawn
from conveyor.scaler.manager.backoff import backoff_note, clear_backoff, open_backoff
from conveyor.scaler.manager.status import scaler_status

LABELS = LabelSetSpec(labels=("linux",))
ENTRY = ScalerEntry(name="local", type="bare-metal", max_agents=4, label_sets=(LABELS,), warm_pool_size=1)


def runtime(**values: object) -> ScalerRuntime:
    made = ScalerRuntime(
        entry=ENTRY, backend=cast(ScalerBackend, SimpleNamespace()), semaphore=asyncio.Semaphore(1)
    )
    for name, value in values.items():
        setattr(made, name, value)
    return made


def spawn(agent_id: str, **values: object) -> Spawn:
    made = Spawn(
        agent_id=agent_id,
        scaler="local",
        label_set=LABELS,
        bound_job_id=None,
        run_id=None,
        org_id=None,
        warm=False,
        cpus=1.0,
        mem_bytes=1024,
        spawned_mono=0.0,
        deadline_mono=300.0,
        timeout_ms=300_000,
    )
    for name, value in values.items():
        setattr(made, name, value)
    return made


def test_a_failure_opens_a_backoff_window_from_now() -> None:
    scaler = runtime(failures=2)
    delay, message = open_backoff(
        scaler, "exec failed", base_ms=1000, max_ms=60_000, max_consecutive=5, now=100.0
    )
    assert (delay, message) == (2000, "exec failed")
    assert (scaler.next_attempt_at, scaler.backoff_ms, scaler.last_error, scaler.failing) == (
        102.0,
        2000,
        "exec failed",
        False,
    )


def test_a_maximum_below_the_base_waits_the_base() -> None:
    scaler = runtime(failures=3)
    delay, _ = open_backoff(scaler, "exec failed", base_ms=1000, max_ms=10, max_consecutive=5, now=0.0)
    assert delay == 1000


def test_the_scaler_is_failing_from_the_threshold_on() -> None:
    scaler = runtime(failures=5)
    _, message = open_backoff(scaler, "exec failed", base_ms=1000, max_ms=3000, max_consecutive=5, now=0.0)
    assert message == "repeated failure (5 in a row): exec failed"
    assert scaler.failing


def test_clearing_the_backoff_starts_the_scaler_afresh_but_keeps_its_last_error() -> None:
    scaler = runtime(failures=5, next_attempt_at=500.0, failing=True, last_error="exec failed")
    clear_backoff(scaler)
    assert (scaler.failures, scaler.next_attempt_at, scaler.failing, scaler.last_error) == (
        0,
        0.0,
        False,
        "exec failed",
    )


def test_the_backoff_note_says_until_when_and_why() -> None:
    scaler = runtime(failures=1, next_attempt_at=0.0, last_error="exec failed")
    assert backoff_note(scaler) == (
        "waiting: scaler local in provision backoff until 1970-01-01T00:00:00+00:00 (1 failure): exec failed"
    )
    scaler.failures = 2
    assert "(2 failures)" in backoff_note(scaler)


def test_status_counts_active_spawning_and_idle_warm_agents() -> None:
    spawns = {
        "starting": spawn("starting"),
        "warm": spawn("warm", warm=True, registered=True),
        "busy": spawn("busy", warm=True, registered=True),
        "ending": spawn("ending", registered=True, ended=True),
    }
    connected = {
        "warm": cast(AgentView, SimpleNamespace(jobs=set())),
        "busy": cast(AgentView, SimpleNamespace(jobs={"job-1"})),
    }
    [shown] = scaler_status({"local": runtime()}, spawns, connected, now=0.0)
    assert shown["active"] == 4  # one being torn down still counts until its teardown is over
    assert (shown["spawning"], shown["warm_idle"], shown["warm_target"]) == (1, 1, 1)
    assert shown["state"] == "active"
    assert shown["backoff"] == {
        "state": "ready",
        "consecutive_failures": 0,
        "next_attempt_at": None,
        "last_error": None,
    }


def test_status_shows_a_failing_scaler_in_backoff() -> None:
    scaler = runtime(failures=5, failing=True, next_attempt_at=60.0, last_error="exec failed")
    [shown] = scaler_status({"local": scaler}, {}, {}, now=0.0)
    assert shown["state"] == "failing"
    assert shown["backoff"]["state"] == "backoff"
    assert shown["backoff"]["next_attempt_at"] == "1970-01-01T00:01:00+00:00"
