"""The owner's job-ownership check bound as a cluster knob (docs/design/cluster.md §4.4):
`cluster_settings.ownership_db_check_timeout_ms`.

Revision ID: 0025
Revises: 0024
"""

import sqlalchemy as sa
from alembic import op

revision = "0025"
down_revision = "0024"


def upgrade() -> None:
    with op.batch_alter_table("cluster_settings") as batch:
        batch.add_column(sa.Column("ownership_db_check_timeout_ms", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("cluster_settings") as batch:
        batch.drop_column("ownership_db_check_timeout_ms")
