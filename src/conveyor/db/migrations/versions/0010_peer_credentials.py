"""Cluster peers: one-time join tokens and peer credentials (docs/design/cluster.md §2.2).

Revision ID: 0010
Revises: 0009
"""

import sqlalchemy as sa
from alembic import op

import conveyor.db.types as ct

revision = "0010"
down_revision = "0009"

_ACTIVE = "rotated_at IS NULL AND revoked_at IS NULL"


def upgrade() -> None:
    op.create_table(
        "join_tokens",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("created_by", sa.String(length=64), nullable=False),
        sa.Column("created_at", ct.UTCDateTime(timezone=True), nullable=False),
        sa.Column("expires_at", ct.UTCDateTime(timezone=True), nullable=False),
        sa.Column("consumed_at", ct.UTCDateTime(timezone=True), nullable=True),
        sa.Column("consumed_by_instance", sa.String(length=64), nullable=True),
        sa.Column("revoked_at", ct.UTCDateTime(timezone=True), nullable=True),
        sa.CheckConstraint("role IN ('coordinator', 'worker')", name=op.f("ck_join_tokens_role")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_join_tokens")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_join_tokens_token_hash")),
    )
    op.create_index("ix_join_tokens_expires_at", "join_tokens", ["expires_at"])
    op.create_table(
        "peer_credentials",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("instance_id", sa.String(length=64), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("stored_key", sa.LargeBinary(), nullable=False),
        sa.Column("server_key", sa.LargeBinary(), nullable=False),
        sa.Column("join_token_id", sa.String(length=36), nullable=True),
        sa.Column("created_at", ct.UTCDateTime(timezone=True), nullable=False),
        sa.Column("expires_at", ct.UTCDateTime(timezone=True), nullable=False),
        sa.Column("rotated_at", ct.UTCDateTime(timezone=True), nullable=True),
        sa.Column("revoked_at", ct.UTCDateTime(timezone=True), nullable=True),
        sa.Column("last_seen_at", ct.UTCDateTime(timezone=True), nullable=True),
        sa.Column("last_validated_by", sa.String(length=64), nullable=True),
        sa.CheckConstraint("role IN ('coordinator', 'worker')", name=op.f("ck_peer_credentials_role")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_peer_credentials")),
    )
    op.create_index("ix_peer_credentials_instance_id", "peer_credentials", ["instance_id"])
    op.create_index(
        "uq_peer_credentials_active",
        "peer_credentials",
        ["instance_id"],
        unique=True,
        sqlite_where=sa.text(_ACTIVE),
        postgresql_where=sa.text(_ACTIVE),
    )


def downgrade() -> None:
    op.drop_index("uq_peer_credentials_active", table_name="peer_credentials")
    op.drop_index("ix_peer_credentials_instance_id", table_name="peer_credentials")
    op.drop_table("peer_credentials")
    op.drop_index("ix_join_tokens_expires_at", table_name="join_tokens")
    op.drop_table("join_tokens")
