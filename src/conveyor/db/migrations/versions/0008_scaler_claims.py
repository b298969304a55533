"""The `event` scaler backend's single-use claims (docs/design/scaler.md §6.4).

Revision ID: 0008
Revises: 0007
"""

import sqlalchemy as sa
from alembic import op

import conveyor.db.types as ct

revision = "0008"
down_revision = "0007"


def upgrade() -> None:
    op.create_table(
        "scaler_claims",
        sa.Column("agent_id", sa.String(length=64), nullable=False),
        sa.Column("code_sha256", sa.String(length=64), nullable=False),
        sa.Column("scaler", sa.String(length=64), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("created_at", ct.UTCDateTime(timezone=True), nullable=False),
        sa.Column("expires_at", ct.UTCDateTime(timezone=True), nullable=False),
        sa.Column("consumed_at", ct.UTCDateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("agent_id", name=op.f("pk_scaler_claims")),
        sa.UniqueConstraint("code_sha256", name=op.f("uq_scaler_claims_code_sha256")),
    )
    op.create_index("ix_scaler_claims_expires_at", "scaler_claims", ["expires_at"])


def downgrade() -> None:
    op.drop_index("ix_scaler_claims_expires_at", table_name="scaler_claims")
    op.drop_table("scaler_claims")
