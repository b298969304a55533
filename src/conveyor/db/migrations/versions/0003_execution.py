"""Execution: sources, deliveries, runs, jobs, steps, dispatch queue, logs, agents, status reports.

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

import conveyor.db.types as ct

revision = "0003"
down_revision = "0002"


def upgrade() -> None:
    op.create_table(
        "agent_tokens",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("org_id", sa.String(length=64), nullable=False),
        sa.Column("label", sa.String(length=100), nullable=True),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("prefix", sa.String(length=16), nullable=False),
        sa.Column(
            "labels",
            ct.JSONDocument,
            nullable=False,
        ),
        sa.Column(
            "mandatory_labels",
            ct.JSONDocument,
            nullable=False,
        ),
        sa.Column("agent_id", sa.String(length=64), nullable=True),
        sa.Column("single_use", sa.Boolean(), server_default="0", nullable=False),
        sa.Column("consumed_at", ct.UTCDateTime(timezone=True), nullable=True),
        sa.Column("created_by", sa.String(length=64), nullable=False),
        sa.Column("created_at", ct.UTCDateTime(timezone=True), nullable=False),
        sa.Column("expires_at", ct.UTCDateTime(timezone=True), nullable=True),
        sa.Column("revoked_at", ct.UTCDateTime(timezone=True), nullable=True),
        sa.Column("last_used_at", ct.UTCDateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_agent_tokens")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_agent_tokens_token_hash")),
    )
    op.create_table(
        "agents",
        sa.Column("agent_id", sa.String(length=64), nullable=False),
        sa.Column("org_id", sa.String(length=64), nullable=False),
        sa.Column("token_id", sa.String(length=36), nullable=True),
        sa.Column(
            "labels",
            ct.JSONDocument,
            nullable=False,
        ),
        sa.Column(
            "mandatory_labels",
            ct.JSONDocument,
            nullable=False,
        ),
        sa.Column("capacity", sa.Integer(), nullable=False),
        sa.Column("version", sa.String(length=64), nullable=True),
        sa.Column("hostname", sa.String(length=255), nullable=True),
        sa.Column("os", sa.String(length=32), nullable=True),
        sa.Column("arch", sa.String(length=32), nullable=True),
        sa.Column("ephemeral", sa.Boolean(), server_default="0", nullable=False),
        sa.Column("instance_id", sa.String(length=64), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("first_seen_at", ct.UTCDateTime(timezone=True), nullable=False),
        sa.Column("connected_at", ct.UTCDateTime(timezone=True), nullable=True),
        sa.Column("last_seen_at", ct.UTCDateTime(timezone=True), nullable=True),
        sa.Column("disconnected_at", ct.UTCDateTime(timezone=True), nullable=True),
        sa.Column("last_close_code", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("agent_id", name=op.f("pk_agents")),
    )
    op.create_table(
        "concurrency_groups",
        sa.Column("scope", sa.String(length=8), nullable=False),
        sa.Column("owner", sa.String(length=500), nullable=False),
        sa.Column("group_key", sa.String(length=500), nullable=False),
        sa.Column("updated_at", ct.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("scope", "owner", "group_key", name=op.f("pk_concurrency_groups")),
    )
    op.create_table(
        "deliveries",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("org_id", sa.String(length=64), nullable=False),
        sa.Column("source_id", sa.String(length=36), nullable=False),
        sa.Column("delivery_id", sa.String(length=200), nullable=False),
        sa.Column("event", sa.String(length=100), nullable=False),
        sa.Column("action", sa.String(length=100), nullable=True),
        sa.Column(
            "headers",
            ct.JSONDocument,
            nullable=False,
        ),
        sa.Column("body", sa.LargeBinary(), nullable=False),
        sa.Column("body_sha256", sa.String(length=64), nullable=False),
        sa.Column("received_at", ct.UTCDateTime(timezone=True), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("skipped", sa.String(length=100), nullable=True),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("next_attempt_at", ct.UTCDateTime(timezone=True), nullable=False),
        sa.Column("lease_owner", sa.String(length=64), nullable=True),
        sa.Column("lease_until", ct.UTCDateTime(timezone=True), nullable=True),
        sa.Column("processed_at", ct.UTCDateTime(timezone=True), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column(
            "decisions",
            ct.JSONDocument,
            nullable=True,
        ),
        sa.Column("run_count", sa.Integer(), server_default="0", nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_deliveries")),
        sa.UniqueConstraint("source_id", "delivery_id", name="uq_deliveries_source_delivery"),
    )
    op.create_index(
        "ix_deliveries_received",
        "deliveries",
        ["next_attempt_at"],
        unique=False,
        sqlite_where=sa.text("status = 'received'"),
        postgresql_where=sa.text("status = 'received'"),
    )
    op.create_index("ix_deliveries_received_at_id", "deliveries", ["received_at", "id"], unique=False)
    op.create_table(
        "dispatch_history",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("job_id", sa.String(length=36), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("agent_id", sa.String(length=64), nullable=True),
        sa.Column("owner_instance_id", sa.String(length=64), nullable=True),
        sa.Column("enqueued_at", ct.UTCDateTime(timezone=True), nullable=True),
        sa.Column("claimed_at", ct.UTCDateTime(timezone=True), nullable=True),
        sa.Column("ended_at", ct.UTCDateTime(timezone=True), nullable=False),
        sa.Column("outcome", sa.String(length=16), nullable=False),
        sa.Column("detail", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_dispatch_history")),
    )
    op.create_index("ix_dispatch_history_job", "dispatch_history", ["job_id"], unique=False)
    op.create_table(
        "dispatch_queue",
        sa.Column("job_id", sa.String(length=36), nullable=False),
        sa.Column("run_id", sa.String(length=36), nullable=False),
        sa.Column("org_id", sa.String(length=64), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column(
            "exact_labels",
            ct.JSONDocument,
            nullable=False,
        ),
        sa.Column(
            "runs_on",
            ct.JSONDocument,
            nullable=False,
        ),
        sa.Column("priority", sa.Integer(), server_default="0", nullable=False),
        sa.Column("enqueued_at", ct.UTCDateTime(timezone=True), nullable=False),
        sa.Column("not_before", ct.UTCDateTime(timezone=True), nullable=False),
        sa.Column("expires_at", ct.UTCDateTime(timezone=True), nullable=True),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("owner_instance_id", sa.String(length=64), nullable=True),
        sa.Column("agent_id", sa.String(length=64), nullable=True),
        sa.Column("bound_agent_id", sa.String(length=64), nullable=True),
        sa.Column("claimed_at", ct.UTCDateTime(timezone=True), nullable=True),
        sa.Column("ack_deadline", ct.UTCDateTime(timezone=True), nullable=True),
        sa.Column("unschedulable", sa.Text(), nullable=True),
        sa.Column("unschedulable_since", ct.UTCDateTime(timezone=True), nullable=True),
        sa.Column("last_provisioning_error", sa.Text(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("job_id", name=op.f("pk_dispatch_queue")),
    )
    op.create_table(
        "job_logs",
        sa.Column("job_id", sa.String(length=36), nullable=False),
        sa.Column("step_index", sa.Integer(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("byte_offset", sa.BigInteger(), nullable=False),
        sa.Column("job_offset", sa.BigInteger(), nullable=False),
        sa.Column("job_prefix", sa.Text(), nullable=True),
        sa.Column("bytes", sa.Integer(), nullable=False),
        sa.Column("line_count", sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.Column("meta", ct.JSONDocument, nullable=False),
        sa.Column("created_at", ct.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("job_id", "step_index", "seq", name=op.f("pk_job_logs")),
    )
    op.create_index("ix_job_logs_job_offset", "job_logs", ["job_id", "job_offset"], unique=False)
    op.create_index(
        "ix_job_logs_step_offset", "job_logs", ["job_id", "step_index", "byte_offset"], unique=False
    )
    op.create_table(
        "job_needs",
        sa.Column("job_id", sa.String(length=36), nullable=False),
        sa.Column("upstream_name", sa.String(length=200), nullable=False),
        sa.Column(
            "run_on",
            ct.JSONDocument,
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("job_id", "upstream_name", name=op.f("pk_job_needs")),
    )
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("run_id", sa.String(length=36), nullable=False),
        sa.Column("org_id", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("matrix_key", sa.String(length=500), server_default="", nullable=False),
        sa.Column("display_name", sa.String(length=700), nullable=False),
        sa.Column(
            "matrix",
            ct.JSONDocument,
            nullable=True,
        ),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("blocked_on", sa.String(length=32), nullable=True),
        sa.Column(
            "runs_on",
            ct.JSONDocument,
            nullable=False,
        ),
        sa.Column("environment", sa.String(length=64), nullable=True),
        sa.Column("concurrency_key", sa.String(length=500), nullable=True),
        sa.Column("timeout_ms", sa.BigInteger(), nullable=True),
        sa.Column("agent_id", sa.String(length=64), nullable=True),
        sa.Column("instance_id", sa.String(length=64), nullable=True),
        sa.Column(
            "outputs",
            ct.JSONDocument,
            nullable=True,
        ),
        sa.Column("created_at", ct.UTCDateTime(timezone=True), nullable=False),
        sa.Column("queued_at", ct.UTCDateTime(timezone=True), nullable=True),
        sa.Column("started_at", ct.UTCDateTime(timezone=True), nullable=True),
        sa.Column("finished_at", ct.UTCDateTime(timezone=True), nullable=True),
        sa.Column("last_heartbeat_at", ct.UTCDateTime(timezone=True), nullable=True),
        sa.Column("recovery_deadline", ct.UTCDateTime(timezone=True), nullable=True),
        sa.Column("cancel_deadline", ct.UTCDateTime(timezone=True), nullable=True),
        sa.Column("log_bytes", sa.BigInteger(), server_default="0", nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobs")),
        sa.UniqueConstraint("run_id", "name", "matrix_key", name="uq_jobs_run_name_matrix"),
    )
    op.create_index(
        "ix_jobs_heartbeat",
        "jobs",
        ["last_heartbeat_at"],
        unique=False,
        sqlite_where=sa.text("status IN ('dispatched', 'running')"),
        postgresql_where=sa.text("status IN ('dispatched', 'running')"),
    )
    op.create_index(
        "ix_jobs_recovery",
        "jobs",
        ["recovery_deadline"],
        unique=False,
        sqlite_where=sa.text("status = 'recovering'"),
        postgresql_where=sa.text("status = 'recovering'"),
    )
    op.create_index("ix_jobs_run", "jobs", ["run_id"], unique=False)
    op.create_table(
        "run_numbers",
        sa.Column("org_id", sa.String(length=64), nullable=False),
        sa.Column("repo", sa.String(length=500), nullable=False),
        sa.Column("workflow", sa.String(length=200), nullable=False),
        sa.Column("last_number", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("org_id", "repo", "workflow", name=op.f("pk_run_numbers")),
    )
    op.create_table(
        "run_timeline",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("run_id", sa.String(length=36), nullable=False),
        sa.Column("job_id", sa.String(length=36), nullable=True),
        sa.Column("at", ct.UTCDateTime(timezone=True), nullable=False),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.Column("kind", sa.String(length=64), nullable=False),
        sa.Column(
            "detail",
            ct.JSONDocument,
            nullable=True,
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_run_timeline")),
    )
    op.create_index("ix_run_timeline_run", "run_timeline", ["run_id", "at"], unique=False)
    op.create_table(
        "runs",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("org_id", sa.String(length=64), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column(
            "trigger_trace",
            ct.JSONDocument,
            nullable=True,
        ),
        sa.Column("source_id", sa.String(length=36), nullable=True),
        sa.Column("routing_key", sa.String(length=255), nullable=True),
        sa.Column("delivery_id", sa.String(length=36), nullable=True),
        sa.Column("event_id", sa.String(length=36), nullable=True),
        sa.Column("registration_id", sa.String(length=36), nullable=True),
        sa.Column("chain_depth", sa.Integer(), server_default="0", nullable=False),
        sa.Column("dispatched_by_failure_lifecycle", sa.Boolean(), server_default="0", nullable=False),
        sa.Column("workflow", sa.String(length=200), nullable=False),
        sa.Column("repo", sa.String(length=500), nullable=False),
        sa.Column("ref", sa.String(length=500), nullable=True),
        sa.Column("sha", sa.String(length=64), nullable=True),
        sa.Column(
            "event",
            ct.JSONDocument,
            nullable=False,
        ),
        sa.Column("lock_sha256", sa.String(length=64), nullable=True),
        sa.Column(
            "workflow_lock",
            ct.JSONDocument,
            nullable=True,
        ),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("concurrency_key", sa.String(length=500), nullable=True),
        sa.Column("parent_run_id", sa.String(length=36), nullable=True),
        sa.Column("created_at", ct.UTCDateTime(timezone=True), nullable=False),
        sa.Column("started_at", ct.UTCDateTime(timezone=True), nullable=True),
        sa.Column("finished_at", ct.UTCDateTime(timezone=True), nullable=True),
        sa.Column("deadline_at", ct.UTCDateTime(timezone=True), nullable=True),
        sa.Column("cancel_requested_at", ct.UTCDateTime(timezone=True), nullable=True),
        sa.Column("cancelled_by", sa.String(length=255), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_runs")),
        sa.UniqueConstraint("delivery_id", "workflow", name="uq_runs_delivery_workflow"),
        sa.UniqueConstraint("event_id", "registration_id", name="uq_runs_event_registration"),
    )
    op.create_index(
        "ix_runs_active",
        "runs",
        ["status"],
        unique=False,
        sqlite_where=sa.text("status NOT IN ('success', 'failed', 'cancelled')"),
        postgresql_where=sa.text("status NOT IN ('success', 'failed', 'cancelled')"),
    )
    op.create_index("ix_runs_created_at_id", "runs", ["created_at", "id"], unique=False)
    op.create_table(
        "sources",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("org_id", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("routing_key", sa.String(length=255), nullable=False),
        sa.Column("repo", sa.Text(), nullable=False),
        sa.Column("api_url", sa.Text(), nullable=True),
        sa.Column("clone_url", sa.Text(), nullable=True),
        sa.Column("default_branch", sa.String(length=255), nullable=True),
        sa.Column("verify", sa.String(length=16), server_default="hmac", nullable=False),
        sa.Column("signature_header", sa.String(length=100), nullable=True),
        sa.Column("event_header", sa.String(length=100), nullable=True),
        sa.Column("report", sa.String(length=16), server_default="statuses", nullable=False),
        sa.Column("enabled", sa.Boolean(), server_default="1", nullable=False),
        sa.Column("created_at", ct.UTCDateTime(timezone=True), nullable=False),
        sa.Column("updated_at", ct.UTCDateTime(timezone=True), nullable=False),
        sa.CheckConstraint("kind IN ('github', 'git', 'local', 'generic')", name=op.f("ck_sources_kind")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sources")),
        sa.UniqueConstraint("org_id", "name", name="uq_sources_org_name"),
        sa.UniqueConstraint("routing_key", name=op.f("uq_sources_routing_key")),
    )
    op.create_table(
        "status_reports",
        sa.Column("source_id", sa.String(length=36), nullable=False),
        sa.Column("sha", sa.String(length=64), nullable=False),
        sa.Column("context", sa.String(length=500), nullable=False),
        sa.Column("run_id", sa.String(length=36), nullable=False),
        sa.Column("job_id", sa.String(length=36), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("description", sa.String(length=140), nullable=True),
        sa.Column("target_url", sa.Text(), nullable=True),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("sent_version", sa.Integer(), server_default="0", nullable=False),
        sa.Column("external_id", sa.String(length=100), nullable=True),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("next_attempt_at", ct.UTCDateTime(timezone=True), nullable=False),
        sa.Column("updated_at", ct.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("source_id", "sha", "context", name=op.f("pk_status_reports")),
    )
    op.create_table(
        "steps",
        sa.Column("job_id", sa.String(length=36), nullable=False),
        sa.Column("step_index", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("kind", sa.String(length=8), nullable=False),
        sa.Column("lock_index", sa.Integer(), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column(
            "outputs",
            ct.JSONDocument,
            nullable=True,
        ),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("started_at", ct.UTCDateTime(timezone=True), nullable=True),
        sa.Column("finished_at", ct.UTCDateTime(timezone=True), nullable=True),
        sa.Column("duration_ms", sa.BigInteger(), nullable=True),
        sa.Column("log_bytes", sa.BigInteger(), server_default="0", nullable=False),
        sa.PrimaryKeyConstraint("job_id", "step_index", name=op.f("pk_steps")),
    )

    op.create_index(
        "ix_dispatch_queue_pending",
        "dispatch_queue",
        [sa.text("priority DESC"), "enqueued_at"],
        unique=False,
        sqlite_where=sa.text("state = 'pending'"),
        postgresql_where=sa.text("state = 'pending'"),
    )


def downgrade() -> None:
    op.drop_index("ix_dispatch_queue_pending", table_name="dispatch_queue")
    op.drop_table("steps")
    op.drop_table("status_reports")
    op.drop_table("sources")
    op.drop_index("ix_runs_created_at_id", table_name="runs")
    op.drop_index(
        "ix_runs_active",
        table_name="runs",
        sqlite_where=sa.text("status NOT IN ('success', 'failed', 'cancelled')"),
        postgresql_where=sa.text("status NOT IN ('success', 'failed', 'cancelled')"),
    )
    op.drop_table("runs")
    op.drop_index("ix_run_timeline_run", table_name="run_timeline")
    op.drop_table("run_timeline")
    op.drop_table("run_numbers")
    op.drop_index("ix_jobs_run", table_name="jobs")
    op.drop_index(
        "ix_jobs_recovery",
        table_name="jobs",
        sqlite_where=sa.text("status = 'recovering'"),
        postgresql_where=sa.text("status = 'recovering'"),
    )
    op.drop_index(
        "ix_jobs_heartbeat",
        table_name="jobs",
        sqlite_where=sa.text("status IN ('dispatched', 'running')"),
        postgresql_where=sa.text("status IN ('dispatched', 'running')"),
    )
    op.drop_table("jobs")
    op.drop_table("job_needs")
    op.drop_index("ix_job_logs_step_offset", table_name="job_logs")
    op.drop_index("ix_job_logs_job_offset", table_name="job_logs")
    op.drop_table("job_logs")
    op.drop_table("dispatch_queue")
    op.drop_index("ix_dispatch_history_job", table_name="dispatch_history")
    op.drop_table("dispatch_history")
    op.drop_index("ix_deliveries_received_at_id", table_name="deliveries")
    op.drop_index(
        "ix_deliveries_received",
        table_name="deliveries",
        sqlite_where=sa.text("status = 'received'"),
        postgresql_where=sa.text("status = 'received'"),
    )
    op.drop_table("deliveries")
    op.drop_table("concurrency_groups")
    op.drop_table("agents")
    op.drop_table("agent_tokens")
