"""Approvals (docs/design/approvals.md): environments' protection rules, jobs' decisions, runs' triggering
token, the held-job retention knob, and an index over waiting jobs for its sweep.

Revision ID: 0020
Revises: 0019
"""

import sqlalchemy as sa
from alembic import op

from conveyor.db import types as ct

revision = "0020"
down_revision = "0019"


def upgrade() -> None:
    with op.batch_alter_table("environments") as batch:
        batch.add_column(sa.Column("protection", ct.JSONDocument, nullable=True))
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("approval", ct.JSONDocument, nullable=True))
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("triggered_by", sa.String(length=64), nullable=True))
    with op.batch_alter_table("cluster_settings") as batch:
        batch.add_column(sa.Column("held_run_retention_days", sa.BigInteger(), nullable=True))
    op.create_index(
        "ix_jobs_waiting_approval",
        "jobs",
        ["blocked_since"],
        unique=False,
        sqlite_where=sa.text("status = 'waiting_approval'"),
        postgresql_where=sa.text("status = 'waiting_approval'"),
    )


def downgrade() -> None:
    op.drop_index("ix_jobs_waiting_approval", table_name="jobs")
    with op.batch_alter_table("cluster_settings") as batch:
        batch.drop_column("held_run_retention_days")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("triggered_by")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("approval")
    with op.batch_alter_table("environments") as batch:
        batch.drop_column("protection")
