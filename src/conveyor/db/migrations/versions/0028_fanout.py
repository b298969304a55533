"""Fan-out (docs/design/execution.md §13): `jobs.fanout` marks a fan-out job, `jobs.fanout_parent_id` and
`.fanout_host` a host execution of one; the fleet knob `cluster_settings.max_fanout_hosts` caps its hosts.

Revision ID: 0028
Revises: 0027
"""

import sqlalchemy as sa
from alembic import op

revision = "0028"
down_revision = "0027"


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("fanout", sa.Boolean(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("fanout_parent_id", sa.String(36), nullable=True))
        batch.add_column(sa.Column("fanout_host", sa.String(64), nullable=True))
    with op.batch_alter_table("cluster_settings") as batch:
        batch.add_column(sa.Column("max_fanout_hosts", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("cluster_settings") as batch:
        batch.drop_column("max_fanout_hosts")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("fanout_host")
        batch.drop_column("fanout_parent_id")
        batch.drop_column("fanout")
