"""The agent's log resend window (conveyor.agent.log_resend): which written chunks an answer confirms, and
what a new connection sends again."""

from __future__ import annotations

from typing import Any

from conveyor.agent.log_resend import LogResendWindow
from conveyor.model import protocol as p


def chunk(seq: int, step: int = 0) -> dict[str, Any]:
    return {"type": "log.chunk", "job_id": "j", "step_index": step, "seq": seq, "lines": []}


def heartbeat(ts: float) -> dict[str, Any]:
    return {"type": "heartbeat", "ts": ts, "running": ["j"]}


def entry(oseq: int) -> dict[str, Any]:
    return {"type": "step.finished", "oseq": oseq, "job_id": "j", "step_index": 0}


def seqs(window: LogResendWindow) -> list[int]:
    return [c["seq"] for _, c in window.chunks]


def test_an_answer_confirms_the_chunks_written_before_its_frame_and_no_later_ones() -> None:
    window = LogResendWindow(limit=100)
    for document in (chunk(0), chunk(1), heartbeat(10.5), chunk(2), entry(7), chunk(3)):
        window.wrote(document)
    window.answered(p.HeartbeatAck(ts=10.5))
    assert seqs(window) == [2, 3]
    window.answered(p.StatusAck(oseq=7))
    assert seqs(window) == [3]


def test_a_later_answer_settles_the_earlier_frames_still_awaiting_theirs() -> None:
    window = LogResendWindow(limit=100)
    for document in (heartbeat(1.0), chunk(0), entry(3), chunk(1)):
        window.wrote(document)
    window.answered(p.StatusAck(oseq=3))
    assert seqs(window) == [1]
    assert window.awaiting == {}
    window.answered(p.HeartbeatAck(ts=1.0))  # already settled: changes nothing
    assert seqs(window) == [1]


def test_unknown_answers_and_other_messages_confirm_nothing() -> None:
    window = LogResendWindow(limit=100)
    window.wrote(chunk(0))
    window.answered(p.StatusAck(oseq=99))
    window.answered(p.HeartbeatAck(ts=4.0))
    window.answered(p.AgentDrain())
    assert seqs(window) == [0]


def test_after_a_lost_connection_no_answer_confirms_a_chunk_until_it_is_written_again() -> None:
    window = LogResendWindow(limit=100)
    window.wrote(chunk(0))
    window.wrote(heartbeat(2.0))
    window.connection_lost()
    window.answered(p.HeartbeatAck(ts=2.0))  # the dead connection's answer cannot arrive on the new one
    window.wrote(heartbeat(3.0))
    window.answered(p.HeartbeatAck(ts=3.0))
    assert seqs(window) == [0]
    resend = window.take()
    assert [c["seq"] for c in resend] == [0] and seqs(window) == []
    for document in resend:
        window.wrote(document)
    window.wrote(heartbeat(4.0))
    window.answered(p.HeartbeatAck(ts=4.0))
    assert seqs(window) == []


def test_a_resend_cut_short_keeps_the_unsent_chunks_after_the_ones_written_in_order() -> None:
    window = LogResendWindow(limit=100)
    for seq in range(4):
        window.wrote(chunk(seq))
    window.connection_lost()
    resend = window.take()
    window.wrote(resend[0])
    window.wrote(resend[1])
    window.keep_unsent(resend[2:])  # the socket failed writing the third
    window.connection_lost()
    assert seqs(window) == [0, 1, 2, 3]


def test_past_the_limit_the_oldest_chunks_are_dropped_and_counted() -> None:
    window = LogResendWindow(limit=2)
    for seq in range(5):
        window.wrote(chunk(seq))
    assert seqs(window) == [3, 4]
    assert window.dropped == 3
