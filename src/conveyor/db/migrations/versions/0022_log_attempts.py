"""A log per execution of a job (docs/design/execution.md §9): `job_logs.attempt` and `.hop` (the dispatch
attempt and the offer hop of the execution that wrote a chunk) in the key and its indexes, and
`jobs.log_attempt` and `.log_hop`, the execution whose log a job shows.

Existing chunks take attempt 1 and hop 0, except those of a job still in the dispatch queue, which take
the queue row's attempt and the holding worker's hop: a job running across the upgrade keeps appending to
the log it started (its agent or worker, of the previous version, names no attempt, and the orchestrator
files such chunks under the job's current one).

Revision ID: 0022
Revises: 0021
"""

import sqlalchemy as sa
from alembic import op

revision = "0022"
down_revision = "0021"


def upgrade() -> None:
    op.drop_index("ix_job_logs_job_offset", table_name="job_logs")
    op.drop_index("ix_job_logs_step_offset", table_name="job_logs")
    with op.batch_alter_table("job_logs") as batch:
        batch.add_column(sa.Column("attempt", sa.Integer(), nullable=False, server_default="1"))
        batch.add_column(sa.Column("hop", sa.Integer(), nullable=False, server_default="0"))
        batch.drop_constraint("pk_job_logs", type_="primary")
        batch.create_primary_key("pk_job_logs", ["job_id", "attempt", "hop", "step_index", "seq"])
    op.execute(
        "UPDATE job_logs SET"
        " attempt = (SELECT q.attempts FROM dispatch_queue q WHERE q.job_id = job_logs.job_id),"
        " hop = COALESCE((SELECT j.reroute_hop FROM jobs j"
        " WHERE j.id = job_logs.job_id AND j.rerouted_to IS NOT NULL), 0)"
        " WHERE job_id IN (SELECT job_id FROM dispatch_queue WHERE attempts > 0)"
    )
    op.create_index(
        "ix_job_logs_job_offset", "job_logs", ["job_id", "attempt", "hop", "job_offset"], unique=False
    )
    op.create_index(
        "ix_job_logs_step_offset",
        "job_logs",
        ["job_id", "attempt", "hop", "step_index", "byte_offset"],
        unique=False,
    )
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("log_attempt", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("log_hop", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("log_hop")
        batch.drop_column("log_attempt")
    # One log per job again: only each job's latest execution is kept.
    op.execute(
        "DELETE FROM job_logs WHERE EXISTS (SELECT 1 FROM job_logs l WHERE l.job_id = job_logs.job_id"
        " AND (l.attempt > job_logs.attempt OR (l.attempt = job_logs.attempt AND l.hop > job_logs.hop)))"
    )
    op.drop_index("ix_job_logs_job_offset", table_name="job_logs")
    op.drop_index("ix_job_logs_step_offset", table_name="job_logs")
    with op.batch_alter_table("job_logs") as batch:
        batch.drop_constraint("pk_job_logs", type_="primary")
        batch.create_primary_key("pk_job_logs", ["job_id", "step_index", "seq"])
        batch.drop_column("hop")
        batch.drop_column("attempt")
    op.create_index("ix_job_logs_job_offset", "job_logs", ["job_id", "job_offset"], unique=False)
    op.create_index(
        "ix_job_logs_step_offset", "job_logs", ["job_id", "step_index", "byte_offset"], unique=False
    )
