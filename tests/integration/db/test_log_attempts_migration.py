"""Migration 0022 (a log per execution, docs/design/execution.md §9) on both databases: existing chunks get
an attempt and a hop (the queue row's attempt for a job still in the queue, else 1; hop 0 without a
worker), the key takes them in, and a downgrade keeps each job's latest execution."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import command

from conveyor.db.engine import create_sync_engine
from conveyor.db.migrate import alembic_config, upgrade_to

NOW = "2026-01-01 00:00:00"


def _chunk(job_id: str, seq: int) -> dict[str, object]:
    return {
        "job_id": job_id,
        "step_index": 1,
        "seq": seq,
        "byte_offset": 0,
        "job_offset": 0,
        "bytes": 1,
        "line_count": 1,
        "data": b"x",
        "meta": "[]",
        "created_at": NOW,
    }


def _rows(url: str, query: str) -> list[tuple[object, ...]]:
    engine = create_sync_engine(url)
    try:
        with engine.connect() as connection:
            return [tuple(row) for row in connection.execute(sa.text(query))]
    finally:
        engine.dispose()


def test_existing_chunks_take_the_queue_rows_attempt_or_1_and_come_back_out(empty_database_url: str) -> None:
    url = empty_database_url
    upgrade_to(url, "0021")
    engine = create_sync_engine(url)
    try:
        with engine.begin() as connection:
            insert = sa.text(
                "INSERT INTO job_logs (job_id, step_index, seq, byte_offset, job_offset, bytes, line_count, data,"
                " meta, created_at) VALUES (:job_id, :step_index, :seq, :byte_offset, :job_offset, :bytes,"
                " :line_count, :data, :meta, :created_at)"
            )
            for job_id, seq in (("finished", 0), ("finished", 1), ("running", 0)):
                connection.execute(insert, _chunk(job_id, seq))
            connection.execute(
                sa.text(
                    "INSERT INTO dispatch_queue (job_id, run_id, org_id, state, exact_labels, runs_on,"
                    " enqueued_at, not_before, attempts) VALUES ('running', 'r', 'default', 'started', '[]',"
                    " '{}', :now, :now, 3)"
                ),
                {"now": NOW},
            )
    finally:
        engine.dispose()

    upgrade_to(url)
    assert _rows(url, "SELECT job_id, seq, attempt, hop FROM job_logs ORDER BY job_id, seq") == [
        ("finished", 0, 1, 0),
        ("finished", 1, 1, 0),
        ("running", 0, 3, 0),
    ]
    engine = create_sync_engine(url)
    try:
        with engine.begin() as connection:
            # Another attempt's chunk with the same seq is a row of its own now.
            connection.execute(
                sa.text(
                    "INSERT INTO job_logs (job_id, attempt, step_index, seq, byte_offset, job_offset, bytes,"
                    " line_count, data, meta, created_at) VALUES ('finished', 2, 1, 0, 0, 0, 1, 1, :data, '[]',"
                    " :now)"
                ),
                {"data": b"y", "now": NOW},
            )
        assert {"log_attempt", "log_hop"} <= {c["name"] for c in sa.inspect(engine).get_columns("jobs")}
    finally:
        engine.dispose()

    config = alembic_config()
    config.set_main_option("sqlalchemy.url", url)
    engine = create_sync_engine(url)
    try:
        with engine.begin() as connection:
            config.attributes["connection"] = connection
            command.downgrade(config, "0021")
        assert not {"attempt", "hop"} & {c["name"] for c in sa.inspect(engine).get_columns("job_logs")}
        assert not {"log_attempt", "log_hop"} & {c["name"] for c in sa.inspect(engine).get_columns("jobs")}
    finally:
        engine.dispose()
    assert _rows(url, "SELECT job_id, seq FROM job_logs ORDER BY job_id, seq") == [
        ("finished", 0),
        ("running", 0),
    ]
