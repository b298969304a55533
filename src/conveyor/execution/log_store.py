"""Job logs, the SQL (docs/design/execution.md §9): append a chunk, read a byte range, read lines for live
follow.

Every chunk is one `job_logs` row written once and never rewritten. Each dispatch attempt of a job has a
log of its own: a chunk belongs to the attempt whose execution wrote it, and `seq`, `byte_offset` and
`job_offset` count within that attempt. `byte_offset` is where its text starts in its step's log;
`job_offset` is where its contribution (the `job_prefix` header, then the text) starts in the job's log.
A job shows one attempt's log (`attempt_shown`): the one whose result was recorded (`jobs.log_attempt`),
else the latest with a chunk. `jobs.log_bytes` and `steps.log_bytes` hold the length of the logs last
appended to.
"""

from __future__ import annotations

import gzip
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, insert, select, text, update
from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.db.channels import LOGS_CHANNEL
from conveyor.db.dialect import notify
from conveyor.db.tables import dispatch_queue, job_logs, jobs, steps
from conveyor.execution.logs import (
    MAX_HEADER_BYTES,
    DispatchAttempt,
    LogItem,
    LogRange,
    attempt_of_unnamed,
    cut_window,
    line_times,
    masker_for,
    render_chunk,
    shown_attempt,
    split_chunk,
    step_header,
)
from conveyor.model.ids import utc_now
from conveyor.model.protocol import LogChunk, LogLine
from conveyor.model.states import JOB_TERMINAL, STEP_TERMINAL

# Chunks still accepted after the job ended (the agent sends a step's lines before its status, but a
# relay through a worker can reorder them).
LATE_CHUNK_GRACE = timedelta(seconds=30)


@dataclass(frozen=True)
class AppendResult:
    """What `append_chunk` did with a chunk.

    `stored` is false for a duplicate (`reason="duplicate"`), an unknown job (`"unknown_job"`) or a
    chunk arriving more than 30 s after its job ended (`"job_finished"`). `attempt` is the log it went
    to. `missing` counts the chunks of the gap noted before this one.
    """

    stored: bool
    reason: str | None = None
    attempt: DispatchAttempt | None = None
    missing: int = 0
    byte_offset: int = 0
    job_offset: int = 0
    bytes: int = 0
    line_count: int = 0


async def append_chunk(
    conn: AsyncConnection,
    *,
    job_id: str,
    step_index: int,
    seq: int,
    lines: Sequence[LogLine],
    attempt: DispatchAttempt | None = None,
    secrets: Sequence[str] = (),
    now: datetime | None = None,
) -> AppendResult:
    """Mask and append one `log.chunk` to the log of `attempt` in the caller's transaction (which should hold
    nothing else); a chunk naming no attempt (an agent or worker of the previous version) goes to the
    job's current one (`current_attempt`).

    On PostgreSQL the transaction commits with `synchronous_commit = off` (logs are not job state) and
    NOTIFYs `conveyor_logs` with the job id. In-process readers are woken by the caller after the commit
    (`LogSignals.wake`), or use `append_chunk_and_wake`.
    """
    at = now or utc_now()
    postgres = conn.dialect.name == "postgresql"
    # The job row lock serialises appends of one job (SQLite: BEGIN IMMEDIATE already did).
    job = (
        await conn.execute(
            select(jobs.c.status, jobs.c.finished_at, jobs.c.log_attempt, jobs.c.log_hop)
            .where(jobs.c.id == job_id)
            .with_for_update()
        )
    ).first()
    if job is None:
        return AppendResult(stored=False, reason="unknown_job")
    if job.status in JOB_TERMINAL and job.finished_at is not None and at - job.finished_at > LATE_CHUNK_GRACE:
        return AppendResult(stored=False, reason="job_finished")
    if attempt is None:
        attempt = await current_attempt(conn, job_id, _counted(job))
    last, previous = await _last_chunks(conn, job_id, attempt, step_index)
    if last is not None and seq <= last.seq:
        return AppendResult(stored=False, reason="duplicate", attempt=attempt)
    missing = seq - (last.seq + 1 if last is not None else 0)
    step_start = last.byte_offset + last.bytes if last is not None else 0
    job_start = _job_end(previous)
    prefix: str | None = None
    if previous is None or previous.step_index != step_index:
        name = (
            await conn.execute(
                select(steps.c.name).where(steps.c.job_id == job_id, steps.c.step_index == step_index)
            )
        ).scalar()
        prefix = step_header(step_index, name)

    rendered = render_chunk(lines, masker=masker_for(tuple(secrets)), missing=missing)
    data = rendered.data
    prefix_bytes = len(prefix.encode("utf-8")) if prefix else 0
    if postgres:
        await conn.execute(text("SET LOCAL synchronous_commit = off"))
    await conn.execute(
        insert(job_logs).values(
            job_id=job_id,
            attempt=attempt.attempt,
            hop=attempt.hop,
            step_index=step_index,
            seq=seq,
            byte_offset=step_start,
            job_offset=job_start,
            job_prefix=prefix,
            bytes=len(data),
            line_count=rendered.line_count,
            data=gzip.compress(data, compresslevel=6),
            meta=rendered.meta,
            created_at=at,
        )
    )
    await conn.execute(
        update(jobs).where(jobs.c.id == job_id).values(log_bytes=job_start + prefix_bytes + len(data))
    )
    await conn.execute(
        update(steps)
        .where(steps.c.job_id == job_id, steps.c.step_index == step_index)
        .values(log_bytes=step_start + len(data))
    )
    await notify(conn, LOGS_CHANNEL, job_id)
    return AppendResult(
        stored=True,
        attempt=attempt,
        missing=missing,
        byte_offset=step_start,
        job_offset=job_start,
        bytes=len(data),
        line_count=rendered.line_count,
    )


async def append_protocol_chunk(
    conn: AsyncConnection, chunk: LogChunk, secrets: list[str], attempt: DispatchAttempt | None
) -> AppendResult:
    """`append_chunk` of a `log.chunk` frame: the agent hub's and the reroute service's `append_log`."""
    return await append_chunk(
        conn,
        job_id=chunk.job_id,
        step_index=chunk.step_index,
        seq=chunk.seq,
        lines=chunk.lines,
        attempt=attempt,
        secrets=secrets,
    )


async def _last_chunks(
    conn: AsyncConnection, job_id: str, attempt: DispatchAttempt, step_index: int
) -> tuple[Any, Any]:
    """The last chunk of the step and the last chunk of the job, both in `attempt`'s log (None for none).

    Dedup and offsets are per attempt: another execution of the job numbers its chunks from 0 as well.
    """
    last = (
        await conn.execute(
            select(job_logs.c.seq, job_logs.c.byte_offset, job_logs.c.bytes)
            .where(job_logs.c.job_id == job_id, *_of(attempt), job_logs.c.step_index == step_index)
            .order_by(job_logs.c.seq.desc())
            .limit(1)
        )
    ).first()
    previous = (
        await conn.execute(
            select(job_logs.c.step_index, job_logs.c.job_offset, job_logs.c.job_prefix, job_logs.c.bytes)
            .where(job_logs.c.job_id == job_id, *_of(attempt))
            .order_by(job_logs.c.job_offset.desc(), job_logs.c.bytes.desc(), job_logs.c.created_at.desc())
            .limit(1)
        )
    ).first()
    return last, previous


def _of(attempt: DispatchAttempt) -> tuple[Any, Any]:
    """The WHERE terms selecting one attempt's chunks."""
    return job_logs.c.attempt == attempt.attempt, job_logs.c.hop == attempt.hop


def _counted(row: Any) -> DispatchAttempt | None:
    """The attempt whose result was recorded, from a `jobs` row's `log_attempt` and `log_hop`."""
    if row.log_attempt is None:
        return None
    return DispatchAttempt(int(row.log_attempt), int(row.log_hop or 0))


async def current_attempt(
    conn: AsyncConnection, job_id: str, counted: DispatchAttempt | None = None
) -> DispatchAttempt:
    """The attempt a chunk or a result naming none belongs to (`logs.attempt_of_unnamed`): the queue row's
    attempt with the holding worker's hop (0 for an agent of a coordinator); `counted` is the job's."""
    row = (
        await conn.execute(
            select(dispatch_queue.c.attempts, jobs.c.rerouted_to, jobs.c.reroute_hop)
            .select_from(dispatch_queue.join(jobs, jobs.c.id == dispatch_queue.c.job_id))
            .where(dispatch_queue.c.job_id == job_id)
        )
    ).first()
    current = None
    if row is not None and row.attempts:
        current = DispatchAttempt(int(row.attempts), int(row.reroute_hop or 0) if row.rerouted_to else 0)
    if current is not None or counted is not None:
        return attempt_of_unnamed(current, counted, None)
    return attempt_of_unnamed(None, None, await _latest_attempt(conn, job_id))


async def attempt_or_current(
    conn: AsyncConnection, job_id: str, named: DispatchAttempt | None
) -> DispatchAttempt:
    """The attempt a message named, else the job's current one (a peer of the previous version)."""
    if named is not None:
        return named
    row = (await conn.execute(select(jobs.c.log_attempt, jobs.c.log_hop).where(jobs.c.id == job_id))).first()
    return await current_attempt(conn, job_id, _counted(row) if row is not None else None)


async def _latest_attempt(conn: AsyncConnection, job_id: str) -> DispatchAttempt | None:
    row = (
        await conn.execute(
            select(job_logs.c.attempt, job_logs.c.hop)
            .where(job_logs.c.job_id == job_id)
            .order_by(job_logs.c.attempt.desc(), job_logs.c.hop.desc())
            .limit(1)
        )
    ).first()
    return DispatchAttempt(int(row.attempt), int(row.hop)) if row is not None else None


async def attempt_shown(conn: AsyncConnection, job_id: str) -> DispatchAttempt:
    """The attempt whose log the job shows (`logs.shown_attempt`)."""
    row = (await conn.execute(select(jobs.c.log_attempt, jobs.c.log_hop).where(jobs.c.id == job_id))).first()
    counted = _counted(row) if row is not None else None
    if counted is not None:
        return shown_attempt(counted, None)
    return shown_attempt(None, await _latest_attempt(conn, job_id))


def _job_end(row: Any) -> int:
    if row is None:
        return 0
    prefix = len(row.job_prefix.encode("utf-8")) if row.job_prefix else 0
    return int(row.job_offset) + prefix + int(row.bytes)


@dataclass(frozen=True)
class LogStatus:
    """Where a log stands: its job's status, the step's (if reading one), whether it has ended, and the
    attempt whose log is shown."""

    job_status: str
    step_status: str | None
    terminal: bool
    attempt: DispatchAttempt = field(default_factory=DispatchAttempt)


async def log_status(conn: AsyncConnection, job_id: str, step: int | None) -> LogStatus | None:
    """The job's (and step's) status; None when the job, or a requested step, is unknown.

    A step is known once it has a `steps` row or a stored chunk. Read this before the log itself: a job
    found terminal has all its chunks stored (bar a relay's late ones).
    """
    job_status = (await conn.execute(select(jobs.c.status).where(jobs.c.id == job_id))).scalar()
    if job_status is None:
        return None
    attempt = await attempt_shown(conn, job_id)
    if step is None:
        return LogStatus(job_status, None, job_status in JOB_TERMINAL, attempt)
    step_status = (
        await conn.execute(select(steps.c.status).where(steps.c.job_id == job_id, steps.c.step_index == step))
    ).scalar()
    if step_status is None:
        has_chunk = (
            await conn.execute(
                select(job_logs.c.seq)
                .where(job_logs.c.job_id == job_id, *_of(attempt), job_logs.c.step_index == step)
                .limit(1)
            )
        ).first()
        if has_chunk is None:
            return None
    terminal = job_status in JOB_TERMINAL or step_status in STEP_TERMINAL
    return LogStatus(job_status, step_status, terminal, attempt)


async def log_end(conn: AsyncConnection, job_id: str, step: int | None, attempt: DispatchAttempt) -> int:
    """The length in bytes of the step's log (or the job's log without `step`) in `attempt`."""
    if step is not None:
        value = (
            await conn.execute(
                select(func.max(job_logs.c.byte_offset + job_logs.c.bytes)).where(
                    job_logs.c.job_id == job_id, *_of(attempt), job_logs.c.step_index == step
                )
            )
        ).scalar()
        return int(value or 0)
    row = (
        await conn.execute(
            select(job_logs.c.job_offset, job_logs.c.job_prefix, job_logs.c.bytes)
            .where(job_logs.c.job_id == job_id, *_of(attempt))
            .order_by(job_logs.c.job_offset.desc(), job_logs.c.bytes.desc())
            .limit(1)
        )
    ).first()
    return _job_end(row)


@dataclass(frozen=True)
class _Chunk:
    step_index: int
    start: int
    prefix: str | None
    data: bytes
    meta: list[list[Any]]

    @property
    def contents(self) -> bytes:
        return (self.prefix or "").encode("utf-8") + self.data

    @property
    def end(self) -> int:
        return self.start + len(self.contents)


async def _chunks_over(
    conn: AsyncConnection, job_id: str, attempt: DispatchAttempt, step: int | None, low: int, high: int
) -> list[_Chunk]:
    """The stored chunks of `attempt` that overlap bytes [low, high] of the log, in order."""
    if step is not None:
        start_col = job_logs.c.byte_offset
        query = select(job_logs).where(
            job_logs.c.job_id == job_id,
            *_of(attempt),
            job_logs.c.step_index == step,
            job_logs.c.byte_offset <= high,
            job_logs.c.byte_offset + job_logs.c.bytes > low,
        )
    else:
        start_col = job_logs.c.job_offset
        # A header adds at most MAX_HEADER_BYTES; chunks that end before `low` are dropped below.
        query = select(job_logs).where(
            job_logs.c.job_id == job_id,
            *_of(attempt),
            job_logs.c.job_offset <= high,
            job_logs.c.job_offset + job_logs.c.bytes + MAX_HEADER_BYTES > low,
        )
    rows = (await conn.execute(query.order_by(start_col, job_logs.c.bytes))).all()
    chunks = [
        _Chunk(
            step_index=row.step_index,
            start=int(row.byte_offset if step is not None else row.job_offset),
            prefix=row.job_prefix if step is None else None,
            data=gzip.decompress(row.data),
            meta=list(row.meta or []),
        )
        for row in rows
    ]
    return [c for c in chunks if c.end > low]


async def read_range(
    conn: AsyncConnection,
    job_id: str,
    *,
    step: int | None,
    offset: int,
    limit_bytes: int,
    timestamps: bool = False,
) -> LogRange | None:
    """Up to `limit_bytes` of the log from `offset` (docs/design/execution.md §9); None for an unknown job or
    step."""
    status = await log_status(conn, job_id, step)
    if status is None:
        return None
    end = await log_end(conn, job_id, step, status.attempt)
    execution = status.attempt.name
    if offset >= end:
        return LogRange("", offset, status.terminal and offset >= end, [] if timestamps else None, execution)
    # One byte past the limit tells whether the window was cut short.
    chunks = await _chunks_over(conn, job_id, status.attempt, step, offset, offset + limit_bytes)
    available = b"".join(c.contents for c in chunks)
    base = chunks[0].start if chunks else offset
    available = available[offset - base :]
    skipped, taken = cut_window(available, limit_bytes)
    next_offset = offset + skipped + len(taken)
    times = None
    if timestamps:
        items = [
            item
            for c in chunks
            for item in split_chunk(
                step_index=c.step_index, start=c.start, prefix=c.prefix, data=c.data, meta=c.meta
            )
        ]
        times = line_times(items, offset + skipped, next_offset)
    return LogRange(
        taken.decode("utf-8"), next_offset, status.terminal and next_offset >= end, times, execution
    )


async def read_items(
    conn: AsyncConnection,
    job_id: str,
    *,
    step: int | None,
    offset: int,
    attempt: DispatchAttempt | None = None,
    max_bytes: int = 262_144,
) -> list[LogItem]:
    """Lines (and, in the job view, step headers) of `attempt`'s log (default: the shown one) ending after
    `offset`, about `max_bytes` of them."""
    if attempt is None:
        attempt = await attempt_shown(conn, job_id)
    chunks = await _chunks_over(conn, job_id, attempt, step, offset, offset + max_bytes)
    items: list[LogItem] = []
    for chunk in chunks:
        items.extend(
            item
            for item in split_chunk(
                step_index=chunk.step_index,
                start=chunk.start,
                prefix=chunk.prefix,
                data=chunk.data,
                meta=chunk.meta,
            )
            if item.end > offset
        )
    return items


async def step_states(conn: AsyncConnection, job_id: str) -> dict[int, tuple[str, str]]:
    """Each step's (name, status) by index."""
    rows = await conn.execute(
        select(steps.c.step_index, steps.c.name, steps.c.status).where(steps.c.job_id == job_id)
    )
    return {int(r.step_index): (str(r.name), str(r.status)) for r in rows}


async def job_of_run(conn: AsyncConnection, run_id: str, job_id: str) -> dict[str, Any] | None:
    """A job's id, name and status if it belongs to the run."""
    row = (
        await conn.execute(
            select(jobs.c.id, jobs.c.name, jobs.c.display_name, jobs.c.status).where(
                jobs.c.id == job_id, jobs.c.run_id == run_id
            )
        )
    ).first()
    return dict(row._mapping) if row else None
