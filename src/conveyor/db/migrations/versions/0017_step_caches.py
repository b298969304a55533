"""What each step's caches did: `step_caches` (docs/design/caches.md §7), for the run page and
`conveyor admin run show`.

Revision ID: 0017
Revises: 0016
"""

import sqlalchemy as sa
from alembic import op

from conveyor.db import types as ct

revision = "0017"
down_revision = "0016"


def upgrade() -> None:
    op.create_table(
        "step_caches",
        sa.Column("job_id", sa.String(length=36), primary_key=True),
        sa.Column("step_index", sa.Integer(), primary_key=True),
        sa.Column("key", sa.String(length=512), primary_key=True),
        sa.Column("kind", sa.String(length=8), nullable=True),
        sa.Column("restored_key", sa.String(length=512), nullable=True),
        sa.Column("saved", sa.String(length=8), nullable=True),
        sa.Column("saved_size", sa.BigInteger(), nullable=True),
        sa.Column("updated_at", ct.UTCDateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("step_caches")
