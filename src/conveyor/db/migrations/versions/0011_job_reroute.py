"""Job rerouting to workers: the `jobs.reroute_*` columns (docs/design/cluster.md §4.2).

Revision ID: 0011
Revises: 0010
"""

import sqlalchemy as sa
from alembic import op

import conveyor.db.types as ct

revision = "0011"
down_revision = "0010"

_ARMED = "reroute_window_expires_at IS NOT NULL"


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("rerouted_to", sa.String(length=64), nullable=True))
        batch.add_column(sa.Column("reroute_hop", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("reroute_tried", ct.JSONDocument, nullable=True))
        batch.add_column(sa.Column("reroute_spawn_max_attempts", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("reroute_spawn_retry_backoff_ms", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("reroute_spawn_failures", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("reroute_window_expires_at", ct.UTCDateTime(timezone=True), nullable=True))
    # The leader's sweep looks for armed windows that lapsed: only armed rows are indexed.
    op.create_index(
        "ix_jobs_reroute_window",
        "jobs",
        ["reroute_window_expires_at"],
        sqlite_where=sa.text(_ARMED),
        postgresql_where=sa.text(_ARMED),
    )


def downgrade() -> None:
    op.drop_index("ix_jobs_reroute_window", table_name="jobs")
    with op.batch_alter_table("jobs") as batch:
        for column in (
            "reroute_window_expires_at",
            "reroute_spawn_failures",
            "reroute_spawn_retry_backoff_ms",
            "reroute_spawn_max_attempts",
            "reroute_tried",
            "reroute_hop",
            "rerouted_to",
        ):
            batch.drop_column(column)
