"""The shared scaler configuration (docs/design/scaler.md §11): one row holding a `scalers.yaml` that
coordinators and workers without a local file run, with its own version.

Revision ID: 0027
Revises: 0026
"""

import sqlalchemy as sa
from alembic import op

import conveyor.db.types as ct

revision = "0027"
down_revision = "0026"


def upgrade() -> None:
    op.create_table(
        "scaler_config",
        sa.Column("id", sa.String(length=16), nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.Column("content", sa.Text(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("updated_at", ct.UTCDateTime(timezone=True), nullable=False),
        sa.Column("updated_by", sa.String(length=64), nullable=True),
        sa.CheckConstraint("id = 'default'", name=op.f("ck_scaler_config_single_row")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_scaler_config")),
    )


def downgrade() -> None:
    op.drop_table("scaler_config")
