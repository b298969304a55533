"""Dispatch extras: concurrency, expiry, re-runs (issue 7).

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

import conveyor.db.types as ct

revision = "0004"
down_revision = "0003"


def upgrade() -> None:
    # Since when a ready job waits for its concurrency group or `max_parallel` (the wait timeout).
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("blocked_since", ct.UTCDateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("blocked_since")
