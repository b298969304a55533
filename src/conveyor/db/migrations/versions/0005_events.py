"""Internal events: event store, registrations, schedules (issue 10).

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

import conveyor.db.types as ct

revision = "0005"
down_revision = "0004"


def upgrade() -> None:
    op.create_table(
        "event_trust",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("org_id", sa.String(length=64), nullable=False),
        sa.Column("source_routing_key", sa.String(length=255), nullable=False),
        sa.Column("source_repo", sa.String(length=500), nullable=False),
        sa.Column("target_routing_key", sa.String(length=255), nullable=False),
        sa.Column("target_repo", sa.String(length=500), nullable=False),
        sa.Column("event_names", ct.JSONDocument, nullable=False),
        sa.Column("enabled", sa.Boolean(), server_default="1", nullable=False),
        sa.Column("created_at", ct.UTCDateTime(timezone=True), nullable=False),
        sa.Column("created_by", sa.String(length=64), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_event_trust")),
        sa.UniqueConstraint(
            "org_id",
            "source_routing_key",
            "source_repo",
            "target_routing_key",
            "target_repo",
            name="uq_event_trust_key",
        ),
    )
    op.create_table(
        "events",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("origin", sa.String(length=16), nullable=False),
        sa.Column("org_id", sa.String(length=64), nullable=True),
        sa.Column("payload", ct.JSONDocument, nullable=False),
        sa.Column("source_routing_key", sa.String(length=255), nullable=True),
        sa.Column("source_repo", sa.String(length=500), nullable=True),
        sa.Column("source_run_id", sa.String(length=36), nullable=True),
        sa.Column("source_job_id", sa.String(length=36), nullable=True),
        sa.Column("target_repos", ct.JSONDocument, nullable=True),
        sa.Column("chain_depth", sa.Integer(), server_default="0", nullable=False),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("dedup_key", sa.String(length=500), nullable=True),
        sa.Column("created_at", ct.UTCDateTime(timezone=True), nullable=False),
        sa.Column("lease_owner", sa.String(length=64), nullable=True),
        sa.Column("lease_expires_at", ct.UTCDateTime(timezone=True), nullable=True),
        sa.Column("next_retry_at", ct.UTCDateTime(timezone=True), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("processed_at", ct.UTCDateTime(timezone=True), nullable=True),
        sa.Column("match_outcome", sa.String(length=32), nullable=True),
        sa.Column("matched_count", sa.Integer(), nullable=True),
        sa.Column("dlq_at", ct.UTCDateTime(timezone=True), nullable=True),
        sa.Column("dlq_reason", sa.String(length=32), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_events")),
        sa.UniqueConstraint("dedup_key", name=op.f("uq_events_dedup_key")),
    )
    op.create_index(
        "ix_events_leased",
        "events",
        ["lease_expires_at"],
        unique=False,
        sqlite_where=sa.text("processed_at IS NULL AND dlq_at IS NULL AND lease_owner IS NOT NULL"),
        postgresql_where=sa.text("processed_at IS NULL AND dlq_at IS NULL AND lease_owner IS NOT NULL"),
    )
    op.create_index(
        "ix_events_source_name_created", "events", ["source_routing_key", "name", "created_at"], unique=False
    )
    op.create_index(
        "ix_events_unfinished",
        "events",
        ["created_at", "id"],
        unique=False,
        sqlite_where=sa.text("processed_at IS NULL AND dlq_at IS NULL"),
        postgresql_where=sa.text("processed_at IS NULL AND dlq_at IS NULL"),
    )
    op.create_table(
        "workflow_registrations",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("org_id", sa.String(length=64), nullable=False),
        sa.Column("routing_key", sa.String(length=255), nullable=False),
        sa.Column("repo", sa.String(length=500), nullable=False),
        sa.Column("workflow_name", sa.String(length=200), nullable=False),
        sa.Column("source_file", sa.String(length=500), nullable=True),
        sa.Column("lock_entry", ct.JSONDocument, nullable=False),
        sa.Column("content_hash", sa.String(length=128), nullable=True),
        sa.Column("commit_sha", sa.String(length=64), nullable=True),
        sa.Column("default_branch", sa.String(length=255), nullable=True),
        sa.Column("provider_context", ct.JSONDocument, nullable=True),
        sa.Column("is_global", sa.Boolean(), server_default="0", nullable=False),
        sa.Column("disabled", sa.Boolean(), server_default="0", nullable=False),
        sa.Column("created_at", ct.UTCDateTime(timezone=True), nullable=False),
        sa.Column("updated_at", ct.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_workflow_registrations")),
        sa.UniqueConstraint("routing_key", "repo", "workflow_name", name="uq_workflow_registrations_key"),
    )
    op.create_index("ix_workflow_registrations_org", "workflow_registrations", ["org_id"], unique=False)
    op.create_table(
        "cron_schedules",
        sa.Column("registration_id", sa.String(length=36), nullable=False),
        sa.Column("schedule_key", sa.String(length=300), nullable=False),
        sa.Column("cron", sa.String(length=200), nullable=False),
        sa.Column("timezone", sa.String(length=100), nullable=False),
        sa.Column("armed_at", ct.UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["registration_id"],
            ["workflow_registrations.id"],
            name=op.f("fk_cron_schedules_registration_id_workflow_registrations"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("registration_id", "schedule_key", name=op.f("pk_cron_schedules")),
    )
    op.create_table(
        "event_batch_windows",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("registration_id", sa.String(length=36), nullable=False),
        sa.Column("org_id", sa.String(length=64), nullable=False),
        sa.Column("routing_key", sa.String(length=255), nullable=False),
        sa.Column("repo", sa.String(length=500), nullable=False),
        sa.Column("opened_at", ct.UTCDateTime(timezone=True), nullable=False),
        sa.Column("closes_at", ct.UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["registration_id"],
            ["workflow_registrations.id"],
            name=op.f("fk_event_batch_windows_registration_id_workflow_registrations"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_event_batch_windows")),
        sa.UniqueConstraint("registration_id", name=op.f("uq_event_batch_windows_registration_id")),
    )
    op.create_index("ix_event_batch_windows_closes", "event_batch_windows", ["closes_at"], unique=False)
    op.create_table(
        "registration_triggers",
        sa.Column("registration_id", sa.String(length=36), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.ForeignKeyConstraint(
            ["registration_id"],
            ["workflow_registrations.id"],
            name=op.f("fk_registration_triggers_registration_id_workflow_registrations"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("registration_id", "kind", name=op.f("pk_registration_triggers")),
    )
    op.create_index("ix_registration_triggers_kind", "registration_triggers", ["kind"], unique=False)
    op.create_table(
        "cron_fires",
        sa.Column("registration_id", sa.String(length=36), nullable=False),
        sa.Column("schedule_key", sa.String(length=300), nullable=False),
        sa.Column("slot_at", ct.UTCDateTime(timezone=True), nullable=False),
        sa.Column("fired_at", ct.UTCDateTime(timezone=True), nullable=False),
        sa.Column("event_id", sa.String(length=36), nullable=True),
        sa.ForeignKeyConstraint(
            ["registration_id", "schedule_key"],
            ["cron_schedules.registration_id", "cron_schedules.schedule_key"],
            name="fk_cron_fires_schedule",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("registration_id", "schedule_key", "slot_at", name=op.f("pk_cron_fires")),
    )
    op.create_table(
        "event_batch_items",
        sa.Column("window_id", sa.String(length=36), nullable=False),
        sa.Column("run_id", sa.String(length=36), nullable=False),
        sa.Column("repo", sa.String(length=500), nullable=False),
        sa.Column("workflow_name", sa.String(length=200), nullable=False),
        sa.Column("failure_class", sa.String(length=100), nullable=True),
        sa.Column("sender", sa.String(length=255), nullable=True),
        sa.Column("chain_depth", sa.Integer(), server_default="0", nullable=False),
        sa.Column("added_at", ct.UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["window_id"],
            ["event_batch_windows.id"],
            name=op.f("fk_event_batch_items_window_id_event_batch_windows"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("window_id", "run_id", name=op.f("pk_event_batch_items")),
    )
    op.create_index(
        "ix_events_created", "events", [sa.text("created_at DESC"), sa.text("id DESC")], unique=False
    )
    op.create_index(
        "ix_events_name_created",
        "events",
        ["name", sa.text("created_at DESC"), sa.text("id DESC")],
        unique=False,
    )
    op.create_index(
        "ix_events_dlq",
        "events",
        [sa.text("dlq_at DESC"), sa.text("id DESC")],
        unique=False,
        sqlite_where=sa.text("dlq_at IS NOT NULL"),
        postgresql_where=sa.text("dlq_at IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_table("event_batch_items")
    op.drop_table("cron_fires")
    op.drop_index("ix_registration_triggers_kind", table_name="registration_triggers")
    op.drop_table("registration_triggers")
    op.drop_index("ix_event_batch_windows_closes", table_name="event_batch_windows")
    op.drop_table("event_batch_windows")
    op.drop_table("cron_schedules")
    op.drop_index("ix_workflow_registrations_org", table_name="workflow_registrations")
    op.drop_table("workflow_registrations")
    op.drop_index(
        "ix_events_unfinished",
        table_name="events",
        sqlite_where=sa.text("processed_at IS NULL AND dlq_at IS NULL"),
        postgresql_where=sa.text("processed_at IS NULL AND dlq_at IS NULL"),
    )
    op.drop_index("ix_events_source_name_created", table_name="events")
    op.drop_index(
        "ix_events_leased",
        table_name="events",
        sqlite_where=sa.text("processed_at IS NULL AND dlq_at IS NULL AND lease_owner IS NOT NULL"),
        postgresql_where=sa.text("processed_at IS NULL AND dlq_at IS NULL AND lease_owner IS NOT NULL"),
    )
    op.drop_index("ix_events_dlq", table_name="events")
    op.drop_index("ix_events_name_created", table_name="events")
    op.drop_index("ix_events_created", table_name="events")
    op.drop_table("events")
    op.drop_table("event_trust")
