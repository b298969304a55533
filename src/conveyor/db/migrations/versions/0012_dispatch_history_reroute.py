"""Why a rerouted offer ended: `dispatch_history.reason` and `.reroute_hop`
(docs/design/cluster.md §4.2, §4.4).

Revision ID: 0012
Revises: 0011
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"


def upgrade() -> None:
    with op.batch_alter_table("dispatch_history") as batch:
        batch.add_column(sa.Column("reason", sa.String(length=32), nullable=True))
        batch.add_column(sa.Column("reroute_hop", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("dispatch_history") as batch:
        batch.drop_column("reroute_hop")
        batch.drop_column("reason")
