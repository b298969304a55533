"""Appending chunks and reading byte ranges, on SQLite and PostgreSQL (docs/design/execution.md §9)."""

from __future__ import annotations

import gzip
from datetime import timedelta

from sqlalchemy import insert, select, update

from conveyor.db.engine import Database
from conveyor.db.tables import dispatch_queue, job_logs, jobs, steps
from conveyor.execution import log_store
from conveyor.execution.logs import DispatchAttempt, LogRange
from conveyor.model.ids import utc_now
from conveyor.model.protocol import LogLine
from tests.integration.execution.conftest import append, finish_job, insert_job

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


async def test_each_attempt_numbers_its_own_chunks_and_the_job_shows_the_latest_while_it_runs(
    database: Database,
) -> None:
    # Found by the chaos harness (issue 44, seed 4701): a job run twice took the second run's chunks for
    # duplicates of the first's (same seq) and showed seq 0 of one run and seq 2-5 of the other.
    job = await insert_job(database, step_names={1: "build"})
    await append(database, job.job_id, 1, 0, ["first run 0"], attempt=1)
    await append(database, job.job_id, 1, 1, ["first run 1"], attempt=1)
    again = await append(database, job.job_id, 1, 0, ["second run 0"], attempt=2)
    assert (again.stored, again.attempt, again.byte_offset, again.job_offset) == (
        True,
        DispatchAttempt(2),
        0,
        0,
    )
    assert (await append(database, job.job_id, 1, 1, ["second run 1"], attempt=2)).stored
    assert (await append(database, job.job_id, 1, 1, ["second run 1 again"], attempt=2)).reason == "duplicate"

    assert (await read(database, job.job_id, 1)).text == "second run 0\nsecond run 1\n"
    assert (await read(database, job.job_id, None)).text == "── 1 build ──\nsecond run 0\nsecond run 1\n"


async def test_the_job_shows_the_log_of_the_attempt_whose_result_counts_even_an_earlier_one(
    database: Database,
) -> None:
    job = await insert_job(database, step_names={1: "build"})
    await append(database, job.job_id, 1, 0, ["the run that counts"], attempt=1)
    await append(database, job.job_id, 1, 0, ["a run that does not"], attempt=2)
    await finish_job(database, job.job_id)
    async with database.transaction() as conn:
        await conn.execute(update(jobs).where(jobs.c.id == job.job_id).values(log_attempt=1, log_hop=0))

    assert await read(database, job.job_id, 1) == LogRange("the run that counts\n", 20, True)
    # A late chunk of the attempt that counts still joins its log; one naming no attempt joins it too.
    assert (await append(database, job.job_id, 1, 1, ["late"], attempt=1)).stored
    unnamed = await append(database, job.job_id, 1, 2, ["unnamed"])
    assert (unnamed.stored, unnamed.attempt) == (True, DispatchAttempt(1))
    assert (await read(database, job.job_id, 1)).text == "the run that counts\nlate\nunnamed\n"


async def test_a_chunk_naming_no_attempt_goes_to_the_queue_rows_attempt(database: Database) -> None:
    # An agent or worker of the previous version names no attempt: its chunks go to the job's current
    # dispatch attempt, the one its queue row counts.
    job = await insert_job(database, step_names={1: "build"}, status="dispatched")
    async with database.transaction() as conn:
        await conn.execute(
            insert(dispatch_queue).values(
                job_id=job.job_id,
                run_id=job.run_id,
                org_id="default",
                state="claimed",
                exact_labels=[],
                runs_on={},
                enqueued_at=utc_now(),
                not_before=utc_now(),
                attempts=3,
            )
        )
    stored = await append(database, job.job_id, 1, 0, ["from an older agent"])
    assert (stored.stored, stored.attempt) == (True, DispatchAttempt(3))
    assert (await read(database, job.job_id, 1)).text == "from an older agent\n"
    # Held by a worker (an offer at hop 2 of that attempt): the worker's hop.
    async with database.transaction() as conn:
        await conn.execute(
            update(jobs).where(jobs.c.id == job.job_id).values(rerouted_to="w2", reroute_hop=2)
        )
    relayed = await append(database, job.job_id, 1, 0, ["from an older worker"])
    assert (relayed.stored, relayed.attempt) == (True, DispatchAttempt(3, 2))


async def test_two_workers_offered_the_job_at_one_attempt_keep_their_logs_apart(database: Database) -> None:
    # A job taken back from a worker (its spawn window lapsed, its start unheard) goes onwards at the same
    # dispatch attempt and the next hop: the hop tells the two executions apart.
    job = await insert_job(database, step_names={1: "build"})
    await append(database, job.job_id, 1, 0, ["frozen worker"], attempt=2, hop=1)
    assert (await append(database, job.job_id, 1, 0, ["next worker"], attempt=2, hop=2)).stored
    assert (await read(database, job.job_id, 1)).text == "next worker\n"
