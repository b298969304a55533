"""`check_run_tracking_ttl_days` in `cluster_settings` (docs/design/execution.md §10.1).

Revision ID: 0026
Revises: 0025
"""

import sqlalchemy as sa
from alembic import op

revision = "0026"
down_revision = "0025"


def upgrade() -> None:
    with op.batch_alter_table("cluster_settings") as batch:
        batch.add_column(sa.Column("check_run_tracking_ttl_days", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("cluster_settings") as batch:
        batch.drop_column("check_run_tracking_ttl_days")
