"""Summoned runs (docs/design/execution.md §8.6): `runs.summoned_by_run_id` and `.summoned_by_job_id`, the run
and job whose step summoned the run, and `runs.summon_key` (`<job_id>:<request_id>`, unique), so an agent's
resend of a summon starts nothing twice.

Revision ID: 0029
Revises: 0028
"""

import sqlalchemy as sa
from alembic import op

revision = "0029"
down_revision = "0028"


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("summoned_by_run_id", sa.String(36), nullable=True))
        batch.add_column(sa.Column("summoned_by_job_id", sa.String(36), nullable=True))
        batch.add_column(sa.Column("summon_key", sa.String(120), nullable=True))
        batch.create_unique_constraint("uq_runs_summon_key", ["summon_key"])
    op.create_index("ix_runs_summoned_by_run_id", "runs", ["summoned_by_run_id"], unique=False)
    op.create_index("ix_runs_summoned_by_job_id", "runs", ["summoned_by_job_id"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_runs_summoned_by_job_id", table_name="runs")
    op.drop_index("ix_runs_summoned_by_run_id", table_name="runs")
    with op.batch_alter_table("runs") as batch:
        batch.drop_constraint("uq_runs_summon_key", type_="unique")
        batch.drop_column("summon_key")
        batch.drop_column("summoned_by_job_id")
        batch.drop_column("summoned_by_run_id")
