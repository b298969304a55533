"""The execution package's hand-written PostgreSQL statements, named by what they do (issue 20, issue 37).

A claim and a job's end run for every dispatched job, so on PostgreSQL they are constant SQL strings run
on the psycopg connection under the SQLAlchemy one (`db/driver_sql.py`: same transaction, SQLAlchemy's
errors). Each has a SQLAlchemy Core twin beside its caller (`queue.py`, `job_end.py`), which SQLite runs;
`tests/integration/execution/test_hand_written_sql.py` runs both on PostgreSQL for the same rows and checks
that they leave the same rows behind.

Parameters follow psycopg (`%(name)s`); JSON goes in as `Jsonb`. Every statement that writes a status is
guarded by `status = ANY(%(sources)s)`, the state machine's sources (`transitions.guard_sources`).
"""

from __future__ import annotations

import functools

from sqlalchemy.ext.asyncio import AsyncConnection

# An execution option: set on a PostgreSQL connection, the package runs the Core twins instead of these
# statements (`await conn.execution_options(**{CORE_ONLY: True})`; the equivalence tests do).
CORE_ONLY = "conveyor_core_only"


def hand_written(conn: AsyncConnection) -> bool:
    """Whether this connection runs the statements of this module (PostgreSQL, unless `CORE_ONLY`)."""
    if conn.dialect.name != "postgresql":
        return False
    started = conn.sync_connection
    return started is None or not started.get_execution_options().get(CORE_ONLY, False)


# --- the queue's claim (`queue.claim_for`)

# The pending, due rows whose exact labels the agent has (globs, excludes and mandatory labels are decided
# in Python after), best first, locked; concurrent claimers skip them.
CLAIM_CANDIDATES = (
    "SELECT job_id, run_id, runs_on, attempts FROM dispatch_queue"
    " WHERE state = 'pending' AND not_before <= %(now)s AND exact_labels <@ %(labels)s"
)
# … only the row an agent is bound to (`bound_job_id`).
CANDIDATES_BOUND = " AND job_id = %(bound)s"
# … none that rerouting handed back to local capacity (a connected worker's slot).
CANDIDATES_NOT_HANDED_BACK = " AND NOT EXISTS (SELECT 1 FROM jobs WHERE jobs.id = dispatch_queue.job_id AND jobs.reroute_tried IS NOT NULL)"
CANDIDATES_ORDER = " ORDER BY priority DESC, enqueued_at LIMIT {limit} FOR UPDATE SKIP LOCKED"


@functools.lru_cache(maxsize=16)
def claim_candidates(*, bound: bool, remote: bool, limit: int) -> str:
    """`CLAIM_CANDIDATES` with its optional terms and the number of rows it locks."""
    return (
        CLAIM_CANDIDATES
        + (CANDIDATES_BOUND if bound else "")
        + (CANDIDATES_NOT_HANDED_BACK if remote else "")
        + CANDIDATES_ORDER.format(limit=limit)
    )


# The queue row claimed for an agent and its job moved to `dispatched`, in one statement; the id of the job
# when it moved (the queue row is claimed either way, as the Core twin does). The queue row is already
# locked by `CLAIM_CANDIDATES`, so the job row is locked after it, in the order every job change takes.
CLAIM_ROW = """
WITH claimed AS (
    UPDATE dispatch_queue SET state = 'claimed', owner_instance_id = %(owner)s, agent_id = %(agent)s,
        attempts = %(attempt)s, claimed_at = %(now)s, ack_deadline = %(ack_deadline)s,
        unschedulable = NULL, unschedulable_since = NULL
    WHERE job_id = %(job_id)s AND state = 'pending'
)
UPDATE jobs SET status = 'dispatched', agent_id = %(agent)s, instance_id = %(owner)s
WHERE id = %(job_id)s AND status = ANY(%(sources)s)
RETURNING id
"""


# --- a job's end (`lifecycle.finish_job`, its statements in `job_end.py`)

# A job's run locked and read with what a job's end needs of it (its conclusion, its commit statuses, its
# group's release): the workflow lock, a large document, only when the run is in a concurrency group.
LOCK_RUN_FOR_FINISH = """
SELECT r.id, r.status, r.reason, r.source_id, r.sha, r.workflow, r.repo, r.concurrency_key,
       r.cancel_requested_at, CASE WHEN r.concurrency_key IS NOT NULL THEN r.workflow_lock END,
       CASE WHEN r.global_source IS NOT NULL AND NOT r.global_required THEN 'none' ELSE s.report END
FROM runs r LEFT JOIN sources s ON s.id = r.source_id
WHERE r.id = (SELECT run_id FROM jobs WHERE id = %(job_id)s)
FOR UPDATE OF r
"""
LOCK_RUN_FOR_FINISH_COLUMNS = (
    "id",
    "status",
    "reason",
    "source_id",
    "sha",
    "workflow",
    "repo",
    "concurrency_key",
    "cancel_requested_at",
    "workflow_lock",
    "report",
)

# A job's queue row locked, after its run (`LOCK_RUN_FOR_FINISH`) and before the job.
LOCK_QUEUE_ROW = "SELECT job_id FROM dispatch_queue WHERE job_id = %(job_id)s FOR UPDATE"

# A job's end in one statement: the job made terminal, its queue row moved to history, its open steps
# closed, the timeline written. Each part follows the job's guarded update, so none is done when that
# changes nothing. Run and queue row are already locked (`LOCK_RUN_FOR_FINISH`, `LOCK_QUEUE_ROW`).
END_JOB = """
WITH job AS (
    UPDATE jobs SET status = %(status)s, reason = %(reason)s, outputs = %(outputs)s, finished_at = %(now)s,
        log_attempt = COALESCE(CAST(%(log_attempt)s AS INTEGER), log_attempt),
        log_hop = COALESCE(CAST(%(log_hop)s AS INTEGER), log_hop)
    WHERE id = %(job_id)s AND status = ANY(%(sources)s)
    RETURNING id, run_id, org_id, name, display_name, matrix_key, concurrency_key, fanout_parent_id
), removed AS (
    DELETE FROM dispatch_queue WHERE job_id IN (SELECT id FROM job)
    RETURNING job_id, attempts, agent_id, owner_instance_id, enqueued_at, claimed_at
), history AS (
    INSERT INTO dispatch_history
        (id, job_id, attempt, agent_id, owner_instance_id, enqueued_at, claimed_at, ended_at, outcome, detail)
    SELECT %(history_id)s, job_id, attempts, agent_id, owner_instance_id, enqueued_at, claimed_at, %(now)s,
        %(outcome)s, %(reason)s
    FROM removed
), closed_steps AS (
    UPDATE steps SET status = 'cancelled', finished_at = %(now)s
    WHERE job_id IN (SELECT id FROM job) AND status = 'running'
), noted AS (
    INSERT INTO run_timeline (id, run_id, job_id, at, source, kind, detail)
    SELECT %(timeline_id)s, run_id, id, %(now)s, 'agent', 'job.finished', %(detail)s FROM job
)
SELECT id, run_id, org_id, name, display_name, matrix_key, concurrency_key, fanout_parent_id,
    (SELECT json_agg(json_build_array(j.name, CASE WHEN j.id = job.id THEN %(status)s ELSE j.status END))
     FROM jobs j WHERE j.run_id = job.run_id)
FROM job
"""
# Its columns but the last, the run's jobs' names and statuses. The statement's snapshot predates its own
# update, hence the job's new status put in by hand. Every other job's end waits on the run's lock we hold.
END_JOB_COLUMNS = (
    "id", "run_id", "org_id", "name", "display_name", "matrix_key", "concurrency_key", "fanout_parent_id"
)  # fmt: skip

# Every job of a run: its name and status.
JOB_STATUSES_OF_RUN = "SELECT name, status FROM jobs WHERE run_id = %(run_id)s"

# A run's end in one statement: the guarded status write and its `run.finished` timeline entry.
END_RUN = """
WITH concluded AS (
    UPDATE runs SET status = %(status)s, finished_at = %(now)s
    WHERE id = %(run_id)s AND status = ANY(%(sources)s)
    RETURNING id
)
INSERT INTO run_timeline (id, run_id, job_id, at, source, kind, detail)
SELECT %(timeline_id)s, id, NULL, %(now)s, 'dispatch', 'run.finished', %(detail)s FROM concluded
RETURNING run_id
"""
