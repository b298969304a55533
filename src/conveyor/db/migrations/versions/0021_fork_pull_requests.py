"""Fork pull requests (docs/design/approvals.md §6): the source setting `fork_pull_requests` and the hold a run
starts with.

Revision ID: 0021
Revises: 0020
"""

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"


def upgrade() -> None:
    with op.batch_alter_table("sources") as batch:
        batch.add_column(
            sa.Column("fork_pull_requests", sa.String(length=24), nullable=False, server_default="hold")
        )
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("held", sa.String(length=100), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("held")
    with op.batch_alter_table("sources") as batch:
        batch.drop_column("fork_pull_requests")
