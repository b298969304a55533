"""`notification_rules`: who is told when a run fails, is fixed or succeeds (docs/design/events.md §10).

Revision ID: 0019
Revises: 0018
"""

import sqlalchemy as sa
from alembic import op

from conveyor.db import types as ct

revision = "0019"
down_revision = "0018"


def upgrade() -> None:
    op.create_table(
        "notification_rules",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("org_id", sa.String(length=64), nullable=False),
        sa.Column("source_id", sa.String(length=36), nullable=True),
        sa.Column("on_events", ct.JSONDocument, nullable=False),
        sa.Column("workflow", sa.String(length=200), nullable=True),
        sa.Column("ref_glob", sa.String(length=500), nullable=True),
        sa.Column("target_kind", sa.String(length=16), nullable=False),
        sa.Column("target", sa.Text(), nullable=False),
        sa.Column("created_at", ct.UTCDateTime(timezone=True), nullable=False),
        sa.Column("created_by", sa.String(length=64), nullable=True),
        sa.CheckConstraint(
            "target_kind IN ('email', 'webhook')", name=op.f("ck_notification_rules_target_kind")
        ),
        sa.ForeignKeyConstraint(
            ["source_id"],
            ["sources.id"],
            name=op.f("fk_notification_rules_source_id_sources"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_notification_rules")),
    )
    op.create_index("ix_notification_rules_org_id", "notification_rules", ["org_id"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_notification_rules_org_id", table_name="notification_rules")
    op.drop_table("notification_rules")
