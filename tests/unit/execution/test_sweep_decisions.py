"""The leader sweep's pure decisions: heartbeat staleness and the queue-timeout reason
(docs/design/execution.md §8.4)."""

from datetime import UTC, datetime, timedelta
from itertools import product

import pytest

from conveyor.execution.sweeps import heartbeat_verdict, queue_timeout_reason

NOW = datetime(2025, 3, 1, 12, tzinfo=UTC)
DEAD_AFTER = timedelta(seconds=45)
STATUSES = ["queued", "dispatched", "running", "recovering", "cancelling", "success"]
AGES = [None, timedelta(0), timedelta(seconds=44), timedelta(seconds=45), timedelta(minutes=5)]


@pytest.mark.parametrize(("status", "age", "connected"), list(product(STATUSES, AGES, [False, True])))
def test_only_silent_jobs_of_agents_connected_nowhere_are_touched(
    status: str, age: timedelta | None, connected: bool
) -> None:
    last_seen = None if age is None else NOW - age
    verdict = heartbeat_verdict(status, last_seen, NOW, DEAD_AFTER, connected)
    silent = age is None or age >= DEAD_AFTER
    if connected or not silent or status not in ("dispatched", "running"):
        assert verdict is None
    else:
        # Before job.started the job is requeued; after, steps may have run, so it recovers.
        assert verdict == ("requeue" if status == "dispatched" else "recover")


def test_the_queue_timeout_reason_names_the_last_note_or_provisioning_error() -> None:
    assert queue_timeout_reason("waiting: 1 matching agent busy", None) == (
        "queue_timeout: waiting: 1 matching agent busy"
    )
    assert queue_timeout_reason(None, "spawn failed: quota") == "queue_timeout: spawn failed: quota"
    assert queue_timeout_reason("unschedulable: x", "spawn failed") == "queue_timeout: unschedulable: x"
    assert queue_timeout_reason(None, None) == "queue_timeout"
    assert queue_timeout_reason("", "") == "queue_timeout"
