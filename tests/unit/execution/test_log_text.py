"""The pure part of job logs: rendering chunks, cutting ranges, SSE frames and wake-ups."""

import asyncio
import json

from conveyor.execution.logs import (
    HeaderItem,
    LineItem,
    LogSignals,
    cut_window,
    line_times,
    log_filename,
    pick_jobs,
    render_chunk,
    split_chunk,
    sse_line,
    step_header,
)
from conveyor.model.masking import Masker
from conveyor.model.protocol import LogLine


def test_lines_end_in_newline_and_sys_lines_are_prefixed() -> None:
    chunk = render_chunk(
        [LogLine(ts=1000, stream="out", text="hello"), LogLine(ts=2000, stream="sys", text="attempt 2/3")],
        masker=Masker(),
    )
    assert chunk.text == "hello\n[conveyor] attempt 2/3\n"
    assert chunk.meta == [[1000, "out"], [2000, "sys"]]


def test_a_gap_writes_the_missing_line_first() -> None:
    chunk = render_chunk([LogLine(ts=5, text="x")], masker=Masker(), missing=2, now_ms=7)
    assert chunk.text == "[conveyor] 2 log chunks missing\nx\n"
    assert chunk.meta == [[7, "sys"], [5, "out"]]


def test_secret_values_are_masked_again() -> None:
    chunk = render_chunk([LogLine(text="token=hunter22 ok")], masker=Masker(["hunter22"]))
    assert chunk.text == "token=*** ok\n"


def test_a_line_with_its_own_newlines_becomes_several_lines() -> None:
    chunk = render_chunk([LogLine(ts=1, stream="err", text="a\r\nb\nc\n")], masker=Masker())
    assert chunk.text == "a\nb\nc\n"
    assert chunk.line_count == 3 and chunk.meta == [[1, "err"]] * 3


def test_header_names_the_step_or_falls_back_to_its_index() -> None:
    assert step_header(1, "build") == "── 1 build ──\n"
    assert step_header(0, None) == "── 0 setup ──\n"
    assert step_header(4, None) == "── 4 step 4 ──\n"


def test_window_ends_on_the_last_line_boundary_inside_the_limit() -> None:
    assert cut_window(b"aaaa\nbbbb\ncccc\n", 12) == (0, b"aaaa\nbbbb\n")
    assert cut_window(b"aaaa\nbbbb\n", 100) == (0, b"aaaa\nbbbb\n")


def test_window_without_a_newline_never_splits_a_character() -> None:
    data = "aé€x\n".encode()  # a, 2-byte é, 3-byte €
    skipped, taken = cut_window(data, 4)
    assert (skipped, taken.decode()) == (0, "aé")
    skipped, taken = cut_window(data, 5)
    assert taken.decode() == "aé"


def test_window_starting_inside_a_character_skips_to_the_next_one() -> None:
    data = "é\nz\n".encode()
    assert cut_window(data[1:], 10) == (1, b"\nz\n")


def test_a_character_wider_than_the_limit_is_returned_whole() -> None:
    assert cut_window("€€\n".encode(), 1) == (0, "€".encode())


def test_split_chunk_gives_offsets_per_line_after_the_header() -> None:
    items = split_chunk(
        step_index=2, start=100, prefix="── 2 x ──\n", data=b"ab\ncd\n", meta=[[1, "out"], [2, "err"]]
    )
    header = len("── 2 x ──\n".encode())
    assert items[0] == HeaderItem(2, 100, 100 + header)
    assert items[1] == LineItem(2, 100 + header, 103 + header, "ab", 1, "out")
    assert items[2] == LineItem(2, 103 + header, 106 + header, "cd", 2, "err")


def test_sse_log_event_carries_the_offset_past_the_line_as_its_id() -> None:
    frame = sse_line(LineItem(1, 10, 20, "line-0002", 1_700_000_000_123, "out"), 10)
    head, data = frame.strip().split("\ndata: ")
    assert head == "id: 20\nevent: log"
    assert json.loads(data) == {
        "step_index": 1,
        "offset": 10,
        "text": "line-0002",
        "ts": "2023-11-14T22:13:20.123Z",
        "stream": "out",
    }


def test_sse_reader_starting_inside_a_line_gets_its_rest() -> None:
    frame = sse_line(LineItem(1, 10, 20, "line-0002", None, "out"), 15)
    assert json.loads(frame.split("data: ")[1])["text"] == "0002"


async def test_a_wake_between_read_and_wait_is_not_lost() -> None:
    signals = LogSignals()
    seen = signals.version("j")
    signals.wake("j")
    assert await signals.wait("j", seen, timeout=5) is True


async def test_a_waiting_reader_is_woken_and_an_idle_one_times_out() -> None:
    signals = LogSignals()
    seen = signals.version("j")
    waiter = asyncio.create_task(signals.wait("j", seen, timeout=5))
    await asyncio.sleep(0)
    signals.wake("other")
    assert not waiter.done()
    signals.wake("j")
    assert await waiter is True
    assert await signals.wait("k", signals.version("k"), timeout=0.01) is False


def test_run_logs_picks_a_job_by_id_name_or_display_name() -> None:
    jobs = [{"id": "1", "name": "build", "display_name": "build (py3.12)"}, {"id": "2", "name": "test"}]
    assert [j["id"] for j in pick_jobs(jobs, None)] == ["1", "2"]
    assert [j["id"] for j in pick_jobs(jobs, "build (py3.12)")] == ["1"]
    assert [j["id"] for j in pick_jobs(jobs, "2")] == ["2"]
    assert pick_jobs(jobs, "nope") == []


def test_a_log_s_download_name_is_safe_to_put_in_a_header_unquoted() -> None:
    assert log_filename("ci", 7, "build", None) == "ci-7-build.log"
    assert log_filename("ci", 7, "build", 2) == "ci-7-build-step-2.log"
    assert log_filename('a"b/c\\d', None, "test (py 3.12, linux)", None) == "a_b_c_d-test_py_3.12_linux.log"
    assert log_filename("..", None, "", None) == "log.log"
    assert len(log_filename("w" * 300, 1, "j", None)) == 124


def test_line_times_follow_the_lines_starting_in_the_range_and_headers_have_none() -> None:
    items = split_chunk(
        step_index=1,
        start=0,
        prefix="── 1 build ──\n",
        data=b"a\nbb\n",
        meta=[[1_796_637_600_000, "out"], [1_796_637_600_001, "err"]],
    )
    header_end = len("── 1 build ──\n".encode())
    assert line_times(items, 0, header_end + 5) == [
        None,
        "2026-12-07T10:00:00.000Z",
        "2026-12-07T10:00:00.001Z",
    ]
    assert line_times(items, header_end + 1, header_end + 5) == ["2026-12-07T10:00:00.001Z"]
    assert line_times(items, header_end + 5, header_end + 9) == []
