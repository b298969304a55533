"""`sources.public_badges`: whether `GET /badge/…` answers for the source (docs/design/execution.md §11).

Revision ID: 0018
Revises: 0017
"""

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"


def upgrade() -> None:
    with op.batch_alter_table("sources") as batch:
        batch.add_column(sa.Column("public_badges", sa.Boolean(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("sources") as batch:
        batch.drop_column("public_badges")
