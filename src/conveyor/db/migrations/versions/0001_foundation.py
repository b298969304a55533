"""Foundation: admin tokens, access log, cluster meta.

Revision ID: 0001
Revises: None
"""

import sqlalchemy as sa
from alembic import op

import conveyor.db.types as ct

revision = "0001"
down_revision = None


def upgrade() -> None:
    op.create_table(
        "access_log",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("org_id", sa.String(length=64), server_default="default", nullable=False),
        sa.Column("at", ct.UTCDateTime(timezone=True), nullable=False),
        sa.Column("actor_type", sa.String(length=16), nullable=False),
        sa.Column("actor_id", sa.String(length=36), nullable=True),
        sa.Column("actor_label", sa.String(length=100), nullable=True),
        sa.Column("actor_role", sa.String(length=16), nullable=True),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.Column("action", sa.String(length=100), nullable=False),
        sa.Column("permission", sa.String(length=64), nullable=True),
        sa.Column("target_type", sa.String(length=64), nullable=True),
        sa.Column("target_id", sa.String(length=255), nullable=True),
        sa.Column("routing_key", sa.String(length=255), nullable=True),
        sa.Column("outcome", sa.String(length=16), nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=False),
        sa.Column("request_id", sa.String(length=64), nullable=True),
        sa.Column("remote_addr", sa.String(length=64), nullable=True),
        sa.Column("error", sa.String(length=500), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_access_log")),
    )
    op.create_index("ix_access_log_actor_at", "access_log", ["actor_id", "at"], unique=False)
    op.create_index("ix_access_log_at_id", "access_log", ["at", "id"], unique=False)
    op.create_index("ix_access_log_target_at", "access_log", ["target_type", "target_id", "at"], unique=False)
    op.create_table(
        "admin_tokens",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("org_id", sa.String(length=64), server_default="default", nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("prefix", sa.String(length=16), nullable=False),
        sa.Column("label", sa.String(length=100), nullable=True),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("routing_key", sa.String(length=255), nullable=True),
        sa.Column("created_by", sa.String(length=36), nullable=False),
        sa.Column("created_at", ct.UTCDateTime(timezone=True), nullable=False),
        sa.Column("expires_at", ct.UTCDateTime(timezone=True), nullable=True),
        sa.Column("revoked_at", ct.UTCDateTime(timezone=True), nullable=True),
        sa.Column("last_used_at", ct.UTCDateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "role IN ('owner', 'admin', 'operator', 'auditor')", name=op.f("ck_admin_tokens_role")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_admin_tokens")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_admin_tokens_token_hash")),
    )
    op.create_table(
        "cluster_meta",
        sa.Column("key", sa.String(length=128), nullable=False),
        sa.Column("value", sa.Text(), nullable=True),
        sa.Column("created_at", ct.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_cluster_meta")),
    )


def downgrade() -> None:
    op.drop_table("cluster_meta")
    op.drop_table("admin_tokens")
    op.drop_index("ix_access_log_target_at", table_name="access_log")
    op.drop_index("ix_access_log_at_id", table_name="access_log")
    op.drop_index("ix_access_log_actor_at", table_name="access_log")
    op.drop_table("access_log")
