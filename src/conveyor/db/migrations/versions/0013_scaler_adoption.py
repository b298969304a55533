"""The scaler backstop's adoption: `scaler_spawns.adopted_by`, `.adopted_at`, and `adopted_by` in the history
(docs/design/cluster.md §7.2).

Revision ID: 0013
Revises: 0012
"""

import sqlalchemy as sa
from alembic import op

from conveyor.db import types as ct

revision = "0013"
down_revision = "0012"


def upgrade() -> None:
    with op.batch_alter_table("scaler_spawns") as batch:
        batch.add_column(sa.Column("adopted_by", sa.String(length=64), nullable=True))
        batch.add_column(sa.Column("adopted_at", ct.UTCDateTime(timezone=True), nullable=True))
    with op.batch_alter_table("scaler_spawn_history") as batch:
        batch.add_column(sa.Column("adopted_by", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("scaler_spawn_history") as batch:
        batch.drop_column("adopted_by")
    with op.batch_alter_table("scaler_spawns") as batch:
        batch.drop_column("adopted_at")
        batch.drop_column("adopted_by")
