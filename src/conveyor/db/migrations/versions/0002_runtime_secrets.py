"""Runtime core and secrets: instances, leader lease, settings, secrets, environments.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

import conveyor.db.types as ct

revision = "0002"
down_revision = "0001"


def upgrade() -> None:
    op.create_table(
        "cluster_instances",
        sa.Column("instance_id", sa.String(length=64), nullable=False),
        sa.Column("boot_id", sa.String(length=36), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("advertise_url", sa.String(length=255), nullable=True),
        sa.Column("software_version", sa.String(length=64), nullable=False),
        sa.Column("started_at", ct.UTCDateTime(timezone=True), nullable=False),
        sa.Column("last_heartbeat_at", ct.UTCDateTime(timezone=True), nullable=False),
        sa.Column("draining", sa.Boolean(), server_default="0", nullable=False),
        sa.Column("applied_settings_version", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("secret_key_fingerprint", sa.String(length=16), nullable=True),
        sa.PrimaryKeyConstraint("instance_id", name=op.f("pk_cluster_instances")),
    )
    op.create_table(
        "cluster_settings",
        sa.Column("id", sa.String(length=16), nullable=False),
        sa.Column("version", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("updated_at", ct.UTCDateTime(timezone=True), nullable=True),
        sa.Column("updated_by", sa.String(length=64), nullable=True),
        sa.Column("max_webhook_payload_bytes", sa.BigInteger(), nullable=True),
        sa.Column("lock_file_max_bytes", sa.BigInteger(), nullable=True),
        sa.Column("webhook_dedup_ttl_ms", sa.BigInteger(), nullable=True),
        sa.Column("queue_max_depth", sa.BigInteger(), nullable=True),
        sa.Column("unroutable_grace_ms", sa.BigInteger(), nullable=True),
        sa.Column("concurrency_wait_timeout_ms", sa.BigInteger(), nullable=True),
        sa.Column("event_router_event_ttl_seconds", sa.BigInteger(), nullable=True),
        sa.Column("event_router_max_dispatch_attempts", sa.BigInteger(), nullable=True),
        sa.Column("event_router_rate_limit_per_workflow_per_minute", sa.BigInteger(), nullable=True),
        sa.Column("event_max_payload_bytes", sa.BigInteger(), nullable=True),
        sa.Column("reroute_ack_timeout_ms", sa.BigInteger(), nullable=True),
        sa.Column("reroute_max_hops", sa.BigInteger(), nullable=True),
        sa.Column("reroute_spawn_window_ms", sa.BigInteger(), nullable=True),
        sa.Column("reroute_spawn_max_attempts", sa.BigInteger(), nullable=True),
        sa.Column("reroute_spawn_retry_backoff_ms", sa.BigInteger(), nullable=True),
        sa.Column("reroute_flap_grace_ms", sa.BigInteger(), nullable=True),
        sa.Column("agent_token_ttl_ms", sa.BigInteger(), nullable=True),
        sa.Column("firecracker_api_socket_wait_ms", sa.BigInteger(), nullable=True),
        sa.Column("scaler_reap_interval_ms", sa.BigInteger(), nullable=True),
        sa.Column("scaler_reap_stranded_timeout_ms", sa.BigInteger(), nullable=True),
        sa.Column("scaler_provision_backoff_base_ms", sa.BigInteger(), nullable=True),
        sa.Column("scaler_provision_backoff_max_ms", sa.BigInteger(), nullable=True),
        sa.Column("scaler_provision_max_consecutive_failures", sa.BigInteger(), nullable=True),
        sa.Column("run_retention_days", sa.BigInteger(), nullable=True),
        sa.Column("audit_retention_days", sa.BigInteger(), nullable=True),
        sa.CheckConstraint("id = 'default'", name=op.f("ck_cluster_settings_single_row")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_cluster_settings")),
    )
    op.create_table(
        "environments",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("org_id", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column(
            "variables",
            ct.JSONDocument,
            nullable=False,
        ),
        sa.Column(
            "allowed_branches",
            ct.JSONDocument,
            nullable=False,
        ),
        sa.Column("created_at", ct.UTCDateTime(timezone=True), nullable=False),
        sa.Column("updated_at", ct.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_environments")),
        sa.UniqueConstraint("org_id", "name", name="uq_environments_org_name"),
    )
    op.create_table(
        "leader_lease",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("holder", sa.String(length=64), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("acquired_at", ct.UTCDateTime(timezone=True), nullable=False),
        sa.Column("expires_at", ct.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_leader_lease")),
    )
    op.create_table(
        "org_settings",
        sa.Column("org_id", sa.String(length=64), nullable=False),
        sa.Column("version", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("updated_at", ct.UTCDateTime(timezone=True), nullable=True),
        sa.Column("updated_by", sa.String(length=64), nullable=True),
        sa.Column("reroute_spawn_window_ms", sa.BigInteger(), nullable=True),
        sa.Column("reroute_ack_timeout_ms", sa.BigInteger(), nullable=True),
        sa.Column("reroute_max_hops", sa.BigInteger(), nullable=True),
        sa.Column("reroute_spawn_max_attempts", sa.BigInteger(), nullable=True),
        sa.Column("reroute_spawn_retry_backoff_ms", sa.BigInteger(), nullable=True),
        sa.Column("dispatch_ack_timeout_ms", sa.BigInteger(), nullable=True),
        sa.Column("scaler_spawn_timeout_ms", sa.BigInteger(), nullable=True),
        sa.Column("queue_timeout_ms", sa.BigInteger(), nullable=True),
        sa.Column("ingest_max_concurrency", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("org_id", name=op.f("pk_org_settings")),
    )
    op.create_table(
        "org_variables",
        sa.Column("org_id", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.Column("updated_at", ct.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("org_id", "name", name=op.f("pk_org_variables")),
    )
    op.create_table(
        "secret_key_versions",
        sa.Column("version", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("fingerprint", sa.String(length=16), nullable=False),
        sa.Column("created_at", ct.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("version", name=op.f("pk_secret_key_versions")),
        sa.UniqueConstraint("fingerprint", name=op.f("uq_secret_key_versions_fingerprint")),
    )
    op.create_table(
        "secrets",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("org_id", sa.String(length=64), nullable=False),
        sa.Column("scope", sa.String(length=128), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("ciphertext", sa.LargeBinary(), nullable=False),
        sa.Column("key_version", sa.Integer(), nullable=False),
        sa.Column("created_at", ct.UTCDateTime(timezone=True), nullable=False),
        sa.Column("updated_at", ct.UTCDateTime(timezone=True), nullable=False),
        sa.Column("updated_by", sa.String(length=64), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_secrets")),
        sa.UniqueConstraint("org_id", "scope", "name", name="uq_secrets_org_scope_name"),
    )
    op.create_index("ix_secrets_key_version", "secrets", ["key_version"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_secrets_key_version", table_name="secrets")
    op.drop_table("secrets")
    op.drop_table("secret_key_versions")
    op.drop_table("org_variables")
    op.drop_table("org_settings")
    op.drop_table("leader_lease")
    op.drop_table("environments")
    op.drop_table("cluster_settings")
    op.drop_table("cluster_instances")
