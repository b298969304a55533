"""Dependency caches: `cache_entries` (docs/design/caches.md §4).

Revision ID: 0015
Revises: 0014
"""

import sqlalchemy as sa
from alembic import op

from conveyor.db import types as ct

revision = "0015"
down_revision = "0014"


def upgrade() -> None:
    op.create_table(
        "cache_entries",
        sa.Column("id", sa.String(length=36), primary_key=True),
        sa.Column("org_id", sa.String(length=64), nullable=False),
        sa.Column("source", sa.String(length=200), nullable=False),
        sa.Column("repo", sa.String(length=500), nullable=False),
        sa.Column("scope", sa.String(length=500), nullable=False),
        sa.Column("key", sa.String(length=512), nullable=False),
        sa.Column("blob_sha256", sa.String(length=64), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("created_at", ct.UTCDateTime(timezone=True), nullable=False),
        sa.Column("last_used_at", ct.UTCDateTime(timezone=True), nullable=False),
        sa.Column("created_by_job_id", sa.String(length=36), nullable=True),
        sa.UniqueConstraint("org_id", "source", "repo", "scope", "key", name="uq_cache_entries_key"),
    )
    op.create_index(
        "ix_cache_entries_last_used", "cache_entries", ["org_id", "source", "repo", "last_used_at"]
    )
    op.create_index("ix_cache_entries_blob_sha256", "cache_entries", ["blob_sha256"])


def downgrade() -> None:
    op.drop_table("cache_entries")
