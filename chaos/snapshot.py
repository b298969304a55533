"""The final database of a run as plain rows for the checker (times as epoch seconds), and the quiescence
the harness waits for before reading it."""

from __future__ import annotations

import time
from collections import defaultdict
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

from chaos.checker import FinalState

QUERIES = {
    "sources": "SELECT id, name FROM sources",
    "deliveries": "SELECT id, source_id, delivery_id, status, run_count, attempts, error FROM deliveries",
    "runs": "SELECT id, delivery_id, event_id, workflow, status, reason, created_at FROM runs",
    "jobs": (
        "SELECT id, run_id, name, matrix_key, status, reason, blocked_on, agent_id, rerouted_to, created_at, "
        "finished_at, log_attempt, log_hop FROM jobs"
    ),
    "needs": "SELECT job_id, upstream_name FROM job_needs",
    "steps": "SELECT job_id, step_index, name, status, attempts FROM steps",
    "finishes": (
        "SELECT job_id, at, detail FROM run_timeline WHERE kind = 'job.finished' AND job_id IS NOT NULL"
    ),
    "queue": "SELECT job_id, state FROM dispatch_queue",
    "events": (
        "SELECT id, name, created_at, processed_at, dlq_at, dlq_reason, attempts, last_error FROM events"
    ),
    "logs": (
        "SELECT job_id, attempt, hop, step_index, seq, byte_offset, bytes, job_offset, job_prefix FROM job_logs"
    ),
    "spawns": "SELECT agent_id, node_id, state FROM scaler_spawns",
    "agents": "SELECT agent_id FROM agents WHERE state = 'online'",
}


def _plain(row: dict[str, Any]) -> dict[str, Any]:
    return {k: (v.timestamp() if isinstance(v, datetime) else v) for k, v in row.items()}


def read_rows(database_url: str, *, attempts: int = 10) -> dict[str, list[dict[str, Any]]]:
    """Every table the checker reads, in one repeatable-read snapshot (retried while the server refuses
    connections: it is shared with other test runs, whose sessions may fill `max_connections`)."""
    for attempt in range(attempts):
        try:
            return _read_rows(database_url)
        except psycopg.OperationalError:
            if attempt == attempts - 1:
                raise
            time.sleep(3)
    raise AssertionError("unreachable")


def _read_rows(database_url: str) -> dict[str, list[dict[str, Any]]]:
    with psycopg.connect(database_url, autocommit=False, connect_timeout=10, row_factory=dict_row) as conn:
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        return {name: [_plain(r) for r in conn.execute(sql).fetchall()] for name, sql in QUERIES.items()}


def final_state(rows: dict[str, list[dict[str, Any]]], *, workers_connected: set[str]) -> FinalState:
    """The checker's view of `rows`."""
    needs: dict[str, list[str]] = defaultdict(list)
    for edge in rows["needs"]:
        needs[edge["job_id"]].append(edge["upstream_name"])
    jobs = [{**job, "needs": needs.get(job["id"], [])} for job in rows["jobs"]]
    finishes = []
    for row in rows["finishes"]:
        detail = row["detail"] or {}
        finishes.append(
            {
                "job_id": row["job_id"],
                "at": row["at"],
                "status": detail.get("status") if isinstance(detail, dict) else None,
            }
        )
    return FinalState(
        sources={s["name"]: s["id"] for s in rows["sources"]},
        deliveries=rows["deliveries"],
        runs=rows["runs"],
        jobs=jobs,
        steps=rows["steps"],
        finishes=finishes,
        queue=rows["queue"],
        events=rows["events"],
        logs=rows["logs"],
        spawns=rows["spawns"],
        agents_online={a["agent_id"] for a in rows["agents"]},
        workers_connected=workers_connected,
    )


QUIET_SQL = {
    "deliveries received": "SELECT count(*) FROM deliveries WHERE status = 'received'",
    "runs unfinished": "SELECT count(*) FROM runs WHERE status NOT IN ('success', 'failed', 'cancelled')",
    "events unfinished": "SELECT count(*) FROM events WHERE processed_at IS NULL AND dlq_at IS NULL",
    "queue rows": "SELECT count(*) FROM dispatch_queue",
    "open spawns": "SELECT count(*) FROM scaler_spawns",
}


def unquiet(database_url: str) -> dict[str, int]:
    """What is still in motion (zero counts left out): empty once the cluster is quiescent."""
    with psycopg.connect(database_url, autocommit=True, connect_timeout=10) as conn:
        counts = {name: int(conn.execute(sql).fetchone()[0]) for name, sql in QUIET_SQL.items()}  # type: ignore[index]
    return {name: n for name, n in counts.items() if n}
