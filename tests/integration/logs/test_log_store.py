"""Appending chunks and reading byte ranges, on SQLite and PostgreSQL (docs/design/execution.md §9)."""

from __future__ import annotations

import gzip
from datetime import timedelta

from sqlalchemy import select

from conveyor.db.engine import Database
from conveyor.db.tables import job_logs, jobs, steps
from conveyor.execution import log_store
from conveyor.execution.logs import LogRange
from conveyor.model.ids import utc_now
from conveyor.model.protocol import LogLine
from tests.integration.logs.conftest import append, finish_job, insert_job

THREE_LINES = ["line-0001", "line-0002", "line-0003"]  # 10 bytes each with the newline


async def read(db: Database, job_id: str, step: int | None, offset: int = 0, limit: int = 65_536) -> LogRange:
    async with db.read() as conn:
        found = await log_store.read_range(conn, job_id, step=step, offset=offset, limit_bytes=limit)
    assert found is not None
    return found


async def test_a_step_range_returns_whole_lines_and_the_next_offset(database: Database) -> None:
    job = await insert_job(database, step_names={1: "build"})
    await append(database, job.job_id, 1, 0, THREE_LINES)

    assert await read(database, job.job_id, 1, offset=10, limit=10) == LogRange("line-0002\n", 20, False)
    assert await read(database, job.job_id, 1, offset=0, limit=25) == LogRange(
        "line-0001\nline-0002\n", 20, False
    )
    assert await read(database, job.job_id, 1, offset=0) == LogRange(
        "".join(f"{t}\n" for t in THREE_LINES), 30, False
    )


async def test_a_read_from_an_offset_returns_exactly_the_rest(database: Database) -> None:
    job = await insert_job(database, step_names={1: "build"})
    await append(database, job.job_id, 1, 0, ["alpha", "beta"])
    await append(database, job.job_id, 1, 1, ["gamma"])
    await append(database, job.job_id, 1, 2, ["delta ünïcödé"])
    whole = (await read(database, job.job_id, 1)).text
    for offset in (0, 6, 11, 17):
        assert (await read(database, job.job_id, 1, offset=offset)).text == whole.encode()[offset:].decode()


async def test_past_the_end_is_empty_with_the_same_offset_and_complete_once_terminal(
    database: Database,
) -> None:
    job = await insert_job(database, step_names={1: "build"})
    await append(database, job.job_id, 1, 0, THREE_LINES)
    assert await read(database, job.job_id, 1, offset=30) == LogRange("", 30, False)
    assert await read(database, job.job_id, 1, offset=99) == LogRange("", 99, False)
    await finish_job(database, job.job_id)
    assert await read(database, job.job_id, 1, offset=20) == LogRange("line-0003\n", 30, True)
    assert (await read(database, job.job_id, None, offset=0, limit=5)).complete is False
    assert (await read(database, job.job_id, None)).complete is True


async def test_duplicates_are_dropped_and_a_gap_is_noted(database: Database) -> None:
    job = await insert_job(database, step_names={1: "build"})
    assert (await append(database, job.job_id, 1, 0, ["first"])).stored
    duplicate = await append(database, job.job_id, 1, 0, ["first again"])
    assert (duplicate.stored, duplicate.reason) == (False, "duplicate")
    gap = await append(database, job.job_id, 1, 3, ["fourth"])
    assert gap.stored and gap.missing == 2
    late = await append(database, job.job_id, 1, 2, ["third, too late"])
    assert late.reason == "duplicate"
    assert (await read(database, job.job_id, 1)).text == "first\n[conveyor] 2 log chunks missing\nfourth\n"


async def test_lines_are_masked_with_the_dispatched_secret_values(database: Database) -> None:
    job = await insert_job(database, step_names={1: "build"})
    await append(database, job.job_id, 1, 0, ["password is s3cr3t-value!"], secrets=["s3cr3t-value"])
    assert (await read(database, job.job_id, 1)).text == "password is ***!\n"
    async with database.read() as conn:
        row = (await conn.execute(select(job_logs.c.data))).scalar_one()
    assert b"s3cr3t" not in gzip.decompress(row)


async def test_the_job_view_puts_a_header_where_the_step_changes(database: Database) -> None:
    job = await insert_job(database, step_names={0: "setup", 1: "build"})
    await append(database, job.job_id, 0, 0, ["cloning"], stream="sys")
    await append(database, job.job_id, 0, 1, ["cloned"])
    await append(database, job.job_id, 1, 0, ["compiling"])
    await append(database, job.job_id, 2, 0, ["from an unnamed step"])
    expected = (
        "── 0 setup ──\n[conveyor] cloning\ncloned\n"
        "── 1 build ──\ncompiling\n"
        "── 2 step 2 ──\nfrom an unnamed step\n"
    )
    whole = await read(database, job.job_id, None)
    assert whole.text == expected and whole.next_offset == len(expected.encode())
    # Step offsets ignore the headers; job offsets continue through them.
    assert (await read(database, job.job_id, 1)).text == "compiling\n"
    start = expected.encode().index("── 1".encode())
    assert (await read(database, job.job_id, None, offset=start)).text == expected.encode()[start:].decode()
    async with database.read() as conn:
        log_bytes = (await conn.execute(select(jobs.c.log_bytes))).scalar_one()
        step_bytes = (
            await conn.execute(select(steps.c.log_bytes).where(steps.c.step_index == 0))
        ).scalar_one()
    assert log_bytes == len(expected.encode())
    assert step_bytes == len("[conveyor] cloning\ncloned\n")


async def test_a_small_limit_in_the_job_view_still_advances_through_a_header(database: Database) -> None:
    job = await insert_job(database, step_names={1: "build"})
    await append(database, job.job_id, 1, 0, ["a", "b"])
    pieces, offset = [], 0
    while True:
        found = await read(database, job.job_id, None, offset=offset, limit=3)
        if found.next_offset == offset:
            break
        pieces.append(found.text)
        offset = found.next_offset
    assert "".join(pieces) == "── 1 build ──\na\nb\n"


async def test_unknown_jobs_and_steps_and_late_chunks_are_refused(database: Database) -> None:
    job = await insert_job(database, step_names={1: "build"})
    assert (await append(database, "no-such-job", 1, 0, ["x"])).reason == "unknown_job"
    async with database.read() as conn:
        assert await log_store.read_range(conn, job.job_id, step=7, offset=0, limit_bytes=10) is None
        assert await log_store.read_range(conn, "nope", step=None, offset=0, limit_bytes=10) is None
    await finish_job(database, job.job_id)
    assert (await append(database, job.job_id, 1, 0, ["just after the end"])).stored
    async with database.transaction() as conn:
        late = await log_store.append_chunk(
            conn,
            job_id=job.job_id,
            step_index=1,
            seq=1,
            lines=[LogLine(text="far too late")],
            now=utc_now() + timedelta(seconds=31),
        )
    assert late.reason == "job_finished"
