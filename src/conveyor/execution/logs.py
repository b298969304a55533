"""Job logs, the pure part (docs/design/execution.md §9): rendering chunks, cutting ranges, SSE frames,
wake-ups.

A step's log is the UTF-8 text of its chunks, each line ending in `\\n`; offsets count its bytes. A job's
log is every chunk of the job in arrival order, a chunk whose step differs from the previous chunk's
preceded by the header line `── <step_index> <name> ──`. Both only ever grow, so an offset read once
stays valid. Each dispatch attempt of a job has such a log; which one a job shows, and which one a chunk
naming no attempt joins, are decided here. The SQL lives in `log_store`.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

from conveyor.aio import wait_event
from conveyor.model.ids import format_rfc3339
from conveyor.model.masking import Masker
from conveyor.model.protocol import LogLine

SYS_PREFIX = "[conveyor] "
# A step name is at most 200 characters (`steps.name`), so a header is at most this many bytes.
MAX_HEADER_BYTES = 4 * 200 + 64
DEFAULT_LIMIT_BYTES = 65_536
MAX_LIMIT_BYTES = 1_048_576


@dataclass(frozen=True, order=True)
class DispatchAttempt:
    """Which execution of a job a log belongs to: the dispatch attempt it began with (`job.dispatch`'s
    `attempt`, the queue row's `attempts` at its claim) and the hop of the offer to a worker it came through
    (0: an agent of the coordinator itself). A job taken back from a worker goes onwards at the same attempt
    and the next hop, so the pair tells every execution apart; ordered as they happened."""

    attempt: int = 1
    hop: int = 0

    @property
    def name(self) -> str:
        """`attempt.hop`, as the range route names the log it read."""
        return f"{self.attempt}.{self.hop}"


def named_attempt(attempt: int | None, hop: int | None = None) -> DispatchAttempt | None:
    """The attempt a message named (its hop 0 unless named), or None when it named none (a peer of the
    previous version)."""
    return DispatchAttempt(attempt, hop or 0) if attempt is not None else None


def shown_attempt(counted: DispatchAttempt | None, latest: DispatchAttempt | None) -> DispatchAttempt:
    """The attempt whose log a job shows: the one whose result was recorded (`counted`), else the latest
    with a chunk, else the first (no log yet)."""
    return counted or latest or DispatchAttempt()


def attempt_of_unnamed(
    current: DispatchAttempt | None, counted: DispatchAttempt | None, latest: DispatchAttempt | None
) -> DispatchAttempt:
    """The attempt a chunk or a result naming none (a peer of the previous version) belongs to: the job's
    current one (`current`: its queue row's attempt, with its holder's hop), else the counted one (the job
    has ended), else the latest with a chunk, else the first."""
    return current or shown_attempt(counted, latest)


@dataclass(frozen=True)
class RenderedChunk:
    """A chunk's stored form: its text, one `[ts_ms, stream]` per line, and its size."""

    text: str
    meta: list[list[Any]]

    @property
    def data(self) -> bytes:
        """The text as UTF-8 (what `bytes` and the offsets count)."""
        return self.text.encode("utf-8")

    @property
    def line_count(self) -> int:
        """How many lines the chunk holds."""
        return len(self.meta)


@lru_cache(maxsize=64)
def masker_for(secrets: tuple[str, ...]) -> Masker:
    """A masker for these secret values (cached: a job's chunks all carry the same values)."""
    return Masker(secrets)


def missing_chunks_line(count: int) -> str:
    """The `sys` line written where chunks never arrived."""
    return f"{count} log chunk{'s' if count != 1 else ''} missing"


def step_header(step_index: int, name: str | None) -> str:
    """The job view's header line (with its newline) before a chunk of another step."""
    shown = (name or fallback_step_name(step_index))[:200]
    return f"── {step_index} {shown} ──\n"


def fallback_step_name(step_index: int) -> str:
    """A step's name when no `steps` row names it yet."""
    return "setup" if step_index == 0 else f"step {step_index}"


def render_chunk(
    lines: Sequence[LogLine], *, masker: Masker, missing: int = 0, now_ms: int | None = None
) -> RenderedChunk:
    """Mask the lines and lay them out as stored: each line ends in `\\n`, `sys` lines are prefixed.

    A line with newlines of its own becomes several lines (same time and stream), so the text always has
    exactly one line per `meta` entry. `missing` > 0 writes the gap line first.
    """
    stamp_now = now_ms if now_ms is not None else int(time.time() * 1000)
    parts: list[str] = []
    meta: list[list[Any]] = []

    def add(text: str, ts_ms: int, stream: str) -> None:
        prefix = SYS_PREFIX if stream == "sys" else ""
        # A lone surrogate cannot be stored as UTF-8; replace it rather than lose the line.
        safe = text.encode("utf-8", errors="replace").decode("utf-8")
        parts.append(prefix + masker.mask(safe) + "\n")
        meta.append([ts_ms, stream])

    if missing > 0:
        add(missing_chunks_line(missing), stamp_now, "sys")
    for line in lines:
        ts_ms = int(line.ts) if line.ts is not None else stamp_now
        text = line.text.replace("\r\n", "\n").replace("\r", "\n")
        if text.endswith("\n"):
            text = text[:-1]
        for piece in text.split("\n"):
            add(piece, ts_ms, line.stream)
    return RenderedChunk("".join(parts), meta)


def _is_continuation(byte: int) -> bool:
    return byte & 0xC0 == 0x80


def cut_window(available: bytes, limit: int) -> tuple[int, bytes]:
    """What a range read returns from `available` (the log from the requested offset on).

    Returns (bytes skipped at the start, bytes returned). A start inside a UTF-8 sequence skips to the
    next character. The result ends on a line boundary when one falls inside `limit`, and never splits a
    character: a single character longer than `limit` is returned whole so a reader always advances.
    """
    skipped = 0
    while skipped < len(available) and _is_continuation(available[skipped]):
        skipped += 1
    rest = available[skipped:]
    if len(rest) <= limit:
        return skipped, rest
    window = rest[:limit]
    newline = window.rfind(b"\n")
    if newline >= 0:
        return skipped, window[: newline + 1]
    end = limit
    while end > 0 and _is_continuation(rest[end]):
        end -= 1
    if end == 0:  # one character wider than the limit
        end = 1
        while end < len(rest) and _is_continuation(rest[end]):
            end += 1
    return skipped, rest[:end]


@dataclass(frozen=True)
class LogRange:
    """The answer of a range read."""

    text: str
    next_offset: int
    complete: bool
    # With `timestamps`: one RFC 3339 time per line that starts in `text` (None for a step header).
    times: list[str | None] | None = None
    # The execution whose log this is (`DispatchAttempt.name`): a reader that sees it change starts over.
    execution: str = "1.0"


@dataclass(frozen=True)
class LineItem:
    """One line of a log with its place: `start` and `end` are offsets (`end` just past its newline)."""

    step_index: int
    start: int
    end: int
    text: str
    ts_ms: int | None
    stream: str


@dataclass(frozen=True)
class HeaderItem:
    """A step header of the job view (sent as an SSE `step` event)."""

    step_index: int
    start: int
    end: int


LogItem = LineItem | HeaderItem


def split_chunk(
    *, step_index: int, start: int, prefix: str | None, data: bytes, meta: Sequence[Sequence[Any]]
) -> list[LogItem]:
    """A stored chunk as items with absolute offsets, the header (job view only) first."""
    items: list[LogItem] = []
    position = start
    if prefix:
        size = len(prefix.encode("utf-8"))
        items.append(HeaderItem(step_index, position, position + size))
        position += size
    raw_lines = data.split(b"\n")[:-1]
    for index, raw in enumerate(raw_lines):
        ts_ms, stream = meta[index] if index < len(meta) else (None, "out")
        end = position + len(raw) + 1
        text = raw.decode("utf-8", errors="replace")
        stamp = int(ts_ms) if ts_ms is not None else None
        items.append(LineItem(step_index, position, end, text, stamp, str(stream)))
        position = end
    return items


def line_times(items: Iterable[LogItem], start: int, end: int) -> list[str | None]:
    """The time of each line starting in bytes [start, end) of a log; a step header has none."""
    return [
        ts_text(item.ts_ms) if isinstance(item, LineItem) else None
        for item in items
        if start <= item.start < end
    ]


def log_filename(workflow: str, number: int | None, job_name: str, step: int | None) -> str:
    """The download name of a job's (or step's) log: `ci-7-build.log`, `ci-7-build-step-2.log`;
    only `[A-Za-z0-9._-]`, so it needs no quoting in `Content-Disposition`."""
    parts = [workflow, str(number) if number is not None else "", job_name]
    if step is not None:
        parts.append(f"step-{step}")
    name = "-".join(p for p in parts if p)
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "log"
    return safe[:120] + ".log"


def ts_text(ts_ms: int | None) -> str | None:
    """A line's time as RFC 3339 UTC with milliseconds."""
    if ts_ms is None:
        return None
    return format_rfc3339(datetime.fromtimestamp(ts_ms / 1000, UTC))


def sse_frame(event: str, data: dict[str, Any], event_id: int | None = None) -> str:
    """One server-sent event."""
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


def sse_line(item: LineItem, offset: int) -> str:
    """A `log` event; its id is the offset just past the line, so `Last-Event-ID` resumes after it."""
    text = item.text
    if offset > item.start:  # a reader that started inside this line gets the rest of it
        cut = item.text.encode("utf-8")[offset - item.start :]
        _, rest = cut_window(cut, len(cut))
        text = rest.decode("utf-8", errors="replace")
    body = {
        "step_index": item.step_index,
        "offset": max(item.start, offset),
        "text": text,
        "ts": ts_text(item.ts_ms),
        "stream": item.stream,
    }
    return sse_frame("log", body, item.end)


class LogSignals:
    """In-process wake-ups for log readers, keyed by job id.

    Writers in this process call `wake(job_id)` after their commit; the PostgreSQL listener calls it
    for NOTIFYs from other processes. A reader takes `version(job_id)` before reading and then
    `wait(job_id, seen, timeout)`, so a wake-up between its read and its wait is never lost.
    """

    def __init__(self) -> None:
        self._versions: dict[str, int] = {}
        self._waiters: dict[str, set[asyncio.Event]] = {}
        self._all = 0

    def version(self, job_id: str) -> int:
        """A counter that moves on every wake-up of this job (or of all jobs)."""
        return self._versions.get(job_id, 0) + self._all

    def wake(self, job_id: str) -> None:
        """New log lines or a status change for this job."""
        self._versions[job_id] = self._versions.get(job_id, 0) + 1
        for event in self._waiters.get(job_id, ()):
            event.set()

    def wake_all(self) -> None:
        """Wake every reader (e.g. after the listener reconnected and may have missed NOTIFYs)."""
        self._all += 1
        for events in self._waiters.values():
            for event in events:
                event.set()

    async def wait(self, job_id: str, seen: int, timeout: float) -> bool:
        """Until the job's version differs from `seen` or `timeout` passes; whether it moved."""
        if self.version(job_id) != seen:
            return True
        event = asyncio.Event()
        waiters = self._waiters.setdefault(job_id, set())
        waiters.add(event)
        try:
            await wait_event(event, timeout)
        finally:
            waiters.discard(event)
            if not waiters:
                self._waiters.pop(job_id, None)
        return self.version(job_id) != seen


def pick_jobs(jobs: Iterable[dict[str, Any]], wanted: str | None) -> list[dict[str, Any]]:
    """The jobs `run logs --job J` names (by id, name or display name); all of them without J."""
    rows = list(jobs)
    if wanted is None:
        return rows
    return [j for j in rows if wanted in (j.get("id"), j.get("name"), j.get("display_name"))]
