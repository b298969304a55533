"""The durable outbox: fsync'ed appends, the ack watermark, replay order, torn lines, truncation."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from conveyor.agent import outbox as outbox_module
from conveyor.agent.outbox import Outbox


def finished(job_id: str, status: str = "success") -> dict[str, object]:
    return {"type": "job.finished", "job_id": job_id, "status": status}


def step(job_id: str, index: int) -> dict[str, object]:
    return {"type": "step.finished", "job_id": job_id, "step_index": index, "status": "success"}


def lines(home: Path) -> list[dict[str, object]]:
    text = (home / "outbox.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines() if line]


def test_append_assigns_increasing_oseq_and_fsyncs_before_returning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[int] = []
    real_fsync = os.fsync

    def spy(fd: int) -> None:
        synced.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(outbox_module.os, "fsync", spy)
    box = Outbox(tmp_path)
    first = box.append(step("a", 1))
    assert synced, "append must fsync"
    second = box.append(finished("a"))
    assert (first["oseq"], second["oseq"]) == (1, 2)
    assert lines(tmp_path) == [first, second]
    assert len(synced) == 2


def test_acks_advance_a_watermark_written_by_rename_and_survive_a_restart(tmp_path: Path) -> None:
    box = Outbox(tmp_path)
    for index in range(1, 4):
        box.append(step("a", index))
    assert box.ack(2)  # out of order
    assert json.loads((tmp_path / "outbox.acked").read_text()) == {"watermark": 0, "above": [2]}
    assert box.ack(1)
    assert json.loads((tmp_path / "outbox.acked").read_text()) == {"watermark": 2, "above": []}
    assert not (tmp_path / "outbox.acked.tmp").exists()
    assert not box.ack(1), "a duplicate ack is not pending"
    again = Outbox(tmp_path)
    assert [entry["oseq"] for entry in again.pending()] == [3]
    assert again.unacked_jobs() == ["a"]


def test_out_of_order_acks_are_not_replayed_after_a_restart(tmp_path: Path) -> None:
    box = Outbox(tmp_path)
    for index in range(1, 4):
        box.append(step("a", index))
    box.ack(3)
    assert [entry["oseq"] for entry in Outbox(tmp_path).pending()] == [1, 2]


def test_replay_is_in_oseq_order_and_lists_unacked_jobs(tmp_path: Path) -> None:
    box = Outbox(tmp_path)
    box.append(step("a", 1))
    box.append(step("b", 1))
    box.append(finished("b"))
    box.append(finished("a"))
    box.ack(2)
    box.ack(3)
    again = Outbox(tmp_path)
    assert [(entry["oseq"], entry["job_id"]) for entry in again.pending()] == [(1, "a"), (4, "a")]
    assert again.unacked_jobs() == ["a"]
    assert again.has_pending("a") and not again.has_pending("b")
    assert again.append(finished("c"))["oseq"] == 5, "oseq never goes back"


def test_a_torn_last_line_is_ignored_and_cut_off(tmp_path: Path) -> None:
    box = Outbox(tmp_path)
    kept = box.append(finished("a"))
    with open(tmp_path / "outbox.jsonl", "ab") as handle:
        handle.write(b'{"type":"job.finished","job_id":"b","oseq":2,"sta')
    again = Outbox(tmp_path)
    assert again.pending() == [kept]
    assert (tmp_path / "outbox.jsonl").read_bytes().endswith(b"}\n")
    appended = again.append(finished("c"))
    assert appended["oseq"] == 2
    assert [entry["job_id"] for entry in lines(tmp_path)] == ["a", "c"]


def test_the_file_is_truncated_once_everything_is_acknowledged(tmp_path: Path) -> None:
    box = Outbox(tmp_path)
    box.append(step("a", 1))
    box.append(finished("a"))
    box.ack(1)
    assert (tmp_path / "outbox.jsonl").stat().st_size > 0
    box.ack(2)
    assert (tmp_path / "outbox.jsonl").stat().st_size == 0
    assert len(box) == 0
    again = Outbox(tmp_path)
    assert again.pending() == [] and again.unacked_jobs() == []
    assert again.append(finished("b"))["oseq"] == 3


def test_a_crash_between_watermark_and_truncation_replays_nothing(tmp_path: Path) -> None:
    box = Outbox(tmp_path)
    box.append(finished("a"))
    content = (tmp_path / "outbox.jsonl").read_bytes()
    box.ack(1)
    (tmp_path / "outbox.jsonl").write_bytes(content)  # as if the truncation never happened
    again = Outbox(tmp_path)
    assert again.pending() == []
    assert (tmp_path / "outbox.jsonl").stat().st_size == 0


def test_an_event_emit_is_acknowledged_by_its_request_id(tmp_path: Path) -> None:
    box = Outbox(tmp_path)
    box.append({"type": "event.emit", "job_id": "a", "request_id": "r1", "name": "deployed"})
    box.append(finished("a"))
    assert box.ack_emit("r1") == 1
    assert box.ack_emit("r1") is None
    assert [entry["oseq"] for entry in box.pending()] == [2]
