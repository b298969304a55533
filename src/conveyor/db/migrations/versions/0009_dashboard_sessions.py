"""Dashboard sign-in sessions, and an index for the runs list filtered by workflow (docs/dashboard.md).

Revision ID: 0009
Revises: 0008
"""

import sqlalchemy as sa
from alembic import op

import conveyor.db.types as ct

revision = "0009"
down_revision = "0008"


def upgrade() -> None:
    op.create_table(
        "dashboard_sessions",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("token_id", sa.String(length=36), nullable=False),
        sa.Column("csrf_token", sa.String(length=64), nullable=False),
        sa.Column("created_at", ct.UTCDateTime(timezone=True), nullable=False),
        sa.Column("last_seen_at", ct.UTCDateTime(timezone=True), nullable=False),
        sa.Column("remote_addr", sa.String(length=64), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_dashboard_sessions")),
    )
    op.create_index("ix_dashboard_sessions_token_id", "dashboard_sessions", ["token_id"])
    op.create_index("ix_dashboard_sessions_last_seen_at", "dashboard_sessions", ["last_seen_at"])
    op.create_index("ix_runs_workflow_created_at_id", "runs", ["workflow", "created_at", "id"])


def downgrade() -> None:
    op.drop_index("ix_runs_workflow_created_at_id", table_name="runs")
    op.drop_index("ix_dashboard_sessions_last_seen_at", table_name="dashboard_sessions")
    op.drop_index("ix_dashboard_sessions_token_id", table_name="dashboard_sessions")
    op.drop_table("dashboard_sessions")
