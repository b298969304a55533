"""Provenance of artifacts (docs/design/artifacts.md §9): `provenance_keys` (every signing key's public half,
never deleted, so old statements keep verifying), `provenance_statements` (one signed DSSE envelope per
artifact, minted on first request) and the `provenance_retention_days` knob in `cluster_settings`.

Revision ID: 0030
Revises: 0029
"""

import sqlalchemy as sa
from alembic import op

from conveyor.db import types as ct

revision = "0030"
down_revision = "0029"


def upgrade() -> None:
    op.create_table(
        "provenance_keys",
        sa.Column("key_id", sa.String(length=64), primary_key=True),
        sa.Column("algorithm", sa.String(length=16), nullable=False),
        sa.Column("public_key", sa.Text(), nullable=False),
        sa.Column("created_at", ct.UTCDateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "provenance_statements",
        sa.Column("artifact_id", sa.String(length=36), primary_key=True),
        sa.Column("run_id", sa.String(length=36), nullable=False),
        sa.Column("key_id", sa.String(length=64), nullable=False),
        sa.Column("envelope", sa.Text(), nullable=False),
        sa.Column("created_at", ct.UTCDateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_provenance_statements_run_id", "provenance_statements", ["run_id"])
    with op.batch_alter_table("cluster_settings") as batch:
        batch.add_column(sa.Column("provenance_retention_days", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("cluster_settings") as batch:
        batch.drop_column("provenance_retention_days")
    op.drop_index("ix_provenance_statements_run_id", table_name="provenance_statements")
    op.drop_table("provenance_statements")
    op.drop_table("provenance_keys")
