"""The worker's durable outbox (docs/design/cluster.md §4.5)."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from conveyor.cluster.outbox import Outbox, outbox_expired

DAY = 24 * 3600.0


class Clock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def message(job_id: str, state: str = "success") -> dict[str, object]:
    return {"type": "job.progress", "job_id": job_id, "run_id": "r", "kind": "job", "state": state, "at": "t"}


def test_an_entry_survives_a_new_outbox_on_the_same_home(tmp_path: Path) -> None:
    Outbox(tmp_path).write("job-1", "c1", message("job-1"))
    entries = Outbox(tmp_path).pending()
    assert [(e.job_id, e.owner, e.message["state"]) for e in entries] == [("job-1", "c1", "success")]
    assert stat.S_IMODE((tmp_path / "outbox").stat().st_mode) == 0o700


def test_an_acknowledged_entry_is_deleted_once(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path)
    outbox.write("job-1", None, message("job-1"))
    assert "job-1" in outbox
    assert outbox.delete("job-1") is True
    assert outbox.delete("job-1") is False
    assert outbox.pending() == []


def test_pending_lists_oldest_first_and_sets_the_gauge(tmp_path: Path) -> None:
    clock = Clock()
    outbox = Outbox(tmp_path, clock=clock)
    outbox.write("job-b", None, message("job-b"))
    clock.now += 1
    outbox.write("job-a", None, message("job-a"))
    assert [e.job_id for e in outbox.pending()] == ["job-b", "job-a"]
    assert outbox.metrics.pending._value.get() == 2


def test_entries_older_than_a_day_are_pruned_and_counted(tmp_path: Path) -> None:
    clock = Clock()
    outbox = Outbox(tmp_path, clock=clock)
    outbox.write("job-old", None, message("job-old"))
    clock.now += DAY - 10
    outbox.write("job-new", None, message("job-new"))
    clock.now += 11
    assert [e.job_id for e in outbox.pending()] == ["job-new"]
    assert outbox.metrics.expired._value.get() == 1
    assert not (tmp_path / "outbox" / "job-old.json").exists()


def test_an_unreadable_entry_is_skipped_not_fatal(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path)
    (tmp_path / "outbox" / "broken.json").write_text("{not json")
    outbox.write("job-1", None, message("job-1"))
    assert [e.job_id for e in outbox.pending()] == ["job-1"]


def test_a_job_id_cannot_escape_the_directory(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        Outbox(tmp_path).write("../evil", None, message("x"))


def test_the_file_holds_owner_and_message_only(tmp_path: Path) -> None:
    Outbox(tmp_path).write("job-1", "c1", message("job-1"))
    data = json.loads((tmp_path / "outbox" / "job-1.json").read_text())
    assert set(data) == {"owner", "message", "written_at"}


@pytest.mark.parametrize(("age", "expired"), [(DAY - 1, False), (DAY, False), (DAY + 1, True)])
def test_the_prune_decision_keeps_a_day(age: float, expired: bool) -> None:
    assert outbox_expired(1000.0, 1000.0 + age) is expired
