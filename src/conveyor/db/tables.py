"""Every table of the schema, in SQLAlchemy Core. Migrations under `db/migrations` create them."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    Float,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    text,
)

from conveyor.db.types import JSONDocument, UTCDateTime
from conveyor.model.knobs import CLUSTER_KNOBS, ORG_KNOBS_BY_NAME

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = MetaData(naming_convention=NAMING_CONVENTION)

DEFAULT_ORG = "default"

# --- foundation (0001)

cluster_meta = Table(
    "cluster_meta",
    metadata,
    Column("key", String(128), primary_key=True),
    Column("value", Text, nullable=True),
    Column("created_at", UTCDateTime, nullable=False),
)

admin_tokens = Table(
    "admin_tokens",
    metadata,
    Column("id", String(36), primary_key=True),
    Column("org_id", String(64), nullable=False, server_default=DEFAULT_ORG),
    Column("token_hash", String(64), nullable=False, unique=True),
    Column("prefix", String(16), nullable=False),
    Column("label", String(100), nullable=True),
    Column("role", String(16), nullable=False),
    Column("routing_key", String(255), nullable=True),
    Column("created_by", String(36), nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Column("expires_at", UTCDateTime, nullable=True),
    Column("revoked_at", UTCDateTime, nullable=True),
    Column("last_used_at", UTCDateTime, nullable=True),
    CheckConstraint("role IN ('owner', 'admin', 'operator', 'auditor')", name="role"),
)

access_log = Table(
    "access_log",
    metadata,
    Column("id", String(36), primary_key=True),
    Column("org_id", String(64), nullable=False, server_default=DEFAULT_ORG),
    Column("at", UTCDateTime, nullable=False),
    Column("actor_type", String(16), nullable=False),
    Column("actor_id", String(36), nullable=True),
    Column("actor_label", String(100), nullable=True),
    Column("actor_role", String(16), nullable=True),
    Column("source", String(16), nullable=False),
    Column("action", String(100), nullable=False),
    Column("permission", String(64), nullable=True),
    Column("target_type", String(64), nullable=True),
    Column("target_id", String(255), nullable=True),
    Column("routing_key", String(255), nullable=True),
    Column("outcome", String(16), nullable=False),
    Column("status_code", Integer, nullable=False),
    Column("request_id", String(64), nullable=True),
    Column("remote_addr", String(64), nullable=True),
    Column("error", String(500), nullable=True),
    Index("ix_access_log_at_id", "at", "id"),
    Index("ix_access_log_actor_at", "actor_id", "at"),
    Index("ix_access_log_target_at", "target_type", "target_id", "at"),
)

# --- runtime core and secrets (0002)

cluster_instances = Table(
    "cluster_instances",
    metadata,
    Column("instance_id", String(64), primary_key=True),
    Column("boot_id", String(36), nullable=False),
    Column("role", String(16), nullable=False),
    Column("advertise_url", String(255), nullable=True),
    Column("software_version", String(64), nullable=False),
    Column("started_at", UTCDateTime, nullable=False),
    Column("last_heartbeat_at", UTCDateTime, nullable=False),
    Column("draining", Boolean, nullable=False, server_default="0"),
    Column("applied_settings_version", BigInteger, nullable=False, server_default="0"),
    Column("secret_key_fingerprint", String(16), nullable=True),
)

leader_lease = Table(
    "leader_lease",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("holder", String(64), nullable=False),
    Column("epoch", BigInteger, nullable=False),
    Column("acquired_at", UTCDateTime, nullable=False),
    Column("expires_at", UTCDateTime, nullable=False),
)

cluster_settings = Table(
    "cluster_settings",
    metadata,
    Column("id", String(16), primary_key=True),
    Column("version", BigInteger, nullable=False, server_default="0"),
    Column("updated_at", UTCDateTime, nullable=True),
    Column("updated_by", String(64), nullable=True),
    *(Column(knob.name, BigInteger, nullable=True) for knob in CLUSTER_KNOBS),
    CheckConstraint("id = 'default'", name="single_row"),
)

# The shared scaler configuration (docs/design/scaler.md §11): at most one row.
scaler_config = Table(
    "scaler_config",
    metadata,
    Column("id", String(16), primary_key=True),
    Column("version", BigInteger, nullable=False),
    Column("content", Text, nullable=False),
    Column("sha256", String(64), nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
    Column("updated_by", String(64), nullable=True),
    CheckConstraint("id = 'default'", name="single_row"),
)

org_settings = Table(
    "org_settings",
    metadata,
    Column("org_id", String(64), primary_key=True),
    Column("version", BigInteger, nullable=False, server_default="0"),
    Column("updated_at", UTCDateTime, nullable=True),
    Column("updated_by", String(64), nullable=True),
    *(Column(name, BigInteger, nullable=True) for name in ORG_KNOBS_BY_NAME),
    # docs/design/global_workflows.md §1: the org's policy sources (a JSON list of routing keys; NULL = none).
    Column("global_sources", JSONDocument, nullable=True),
)

secret_key_versions = Table(
    "secret_key_versions",
    metadata,
    Column("version", Integer, primary_key=True, autoincrement=False),
    Column("fingerprint", String(16), nullable=False, unique=True),
    Column("created_at", UTCDateTime, nullable=False),
)

secrets = Table(
    "secrets",
    metadata,
    Column("id", String(36), primary_key=True),
    Column("org_id", String(64), nullable=False),
    Column("scope", String(128), nullable=False),
    Column("name", String(128), nullable=False),
    Column("ciphertext", LargeBinary, nullable=False),
    Column("key_version", Integer, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
    Column("updated_by", String(64), nullable=True),
    UniqueConstraint("org_id", "scope", "name", name="uq_secrets_org_scope_name"),
    Index("ix_secrets_key_version", "key_version"),
)

environments = Table(
    "environments",
    metadata,
    Column("id", String(36), primary_key=True),
    Column("org_id", String(64), nullable=False),
    Column("name", String(64), nullable=False),
    Column("variables", JSONDocument, nullable=False),
    Column("allowed_branches", JSONDocument, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
    UniqueConstraint("org_id", "name", name="uq_environments_org_name"),
)

org_variables = Table(
    "org_variables",
    metadata,
    Column("org_id", String(64), primary_key=True),
    Column("name", String(128), primary_key=True),
    Column("value", Text, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
)

# --- execution: sources, deliveries, runs, jobs, queue, logs, agents (docs/design/execution.md §3)

sources = Table(
    "sources",
    metadata,
    Column("id", String(36), primary_key=True),
    Column("org_id", String(64), nullable=False),
    Column("name", String(200), nullable=False),
    Column("kind", String(16), nullable=False),
    Column("routing_key", String(255), nullable=False, unique=True),
    Column("repo", Text, nullable=False),
    Column("api_url", Text, nullable=True),
    Column("clone_url", Text, nullable=True),
    Column("default_branch", String(255), nullable=True),
    Column("verify", String(16), nullable=False, server_default="hmac"),
    Column("signature_header", String(100), nullable=True),
    Column("event_header", String(100), nullable=True),
    Column("report", String(16), nullable=False, server_default="statuses"),
    Column("enabled", Boolean, nullable=False, server_default="1"),
    # Off by default: anyone may read the badges of a public source (docs/design/execution.md §11).
    Column("public_badges", Boolean, nullable=False, server_default="0"),
    Column("created_at", UTCDateTime, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
    UniqueConstraint("org_id", "name", name="uq_sources_org_name"),
    CheckConstraint("kind IN ('github', 'git', 'local', 'generic')", name="kind"),
)

deliveries = Table(
    "deliveries",
    metadata,
    Column("id", String(36), primary_key=True),
    Column("org_id", String(64), nullable=False),
    Column("source_id", String(36), nullable=False),
    Column("delivery_id", String(256), nullable=False),
    Column("event", String(256), nullable=False),
    Column("action", String(256), nullable=True),
    Column("headers", JSONDocument, nullable=False),
    Column("body", LargeBinary, nullable=False),
    Column("body_sha256", String(64), nullable=False),
    Column("received_at", UTCDateTime, nullable=False),
    Column("status", String(16), nullable=False),
    Column("skipped", String(100), nullable=True),
    Column("attempts", Integer, nullable=False, server_default="0"),
    Column("next_attempt_at", UTCDateTime, nullable=False),
    Column("lease_owner", String(64), nullable=True),
    Column("lease_until", UTCDateTime, nullable=True),
    Column("processed_at", UTCDateTime, nullable=True),
    Column("error", Text, nullable=True),
    Column("decisions", JSONDocument, nullable=True),
    Column("run_count", Integer, nullable=False, server_default="0"),
    UniqueConstraint("source_id", "delivery_id", name="uq_deliveries_source_delivery"),
    Index(
        "ix_deliveries_received",
        "next_attempt_at",
        sqlite_where=text("status = 'received'"),
        postgresql_where=text("status = 'received'"),
    ),
    Index("ix_deliveries_received_at_id", "received_at", "id"),
)

run_numbers = Table(
    "run_numbers",
    metadata,
    Column("org_id", String(64), primary_key=True),
    Column("repo", String(500), primary_key=True),
    Column("workflow", String(200), primary_key=True),
    Column("last_number", Integer, nullable=False),
)

runs = Table(
    "runs",
    metadata,
    Column("id", String(36), primary_key=True),
    Column("org_id", String(64), nullable=False),
    Column("number", Integer, nullable=False),
    Column("trigger_trace", JSONDocument, nullable=True),
    Column("source_id", String(36), nullable=True),
    Column("routing_key", String(255), nullable=True),
    Column("delivery_id", String(36), nullable=True),
    Column("event_id", String(36), nullable=True),
    Column("registration_id", String(36), nullable=True),
    Column("chain_depth", Integer, nullable=False, server_default="0"),
    Column("dispatched_by_failure_lifecycle", Boolean, nullable=False, server_default="0"),
    Column("workflow", String(200), nullable=False),
    Column("repo", String(500), nullable=False),
    Column("ref", String(500), nullable=True),
    Column("sha", String(64), nullable=True),
    Column("event", JSONDocument, nullable=False),
    Column("lock_sha256", String(64), nullable=True),
    Column("workflow_lock", JSONDocument, nullable=True),
    Column("status", String(16), nullable=False),
    Column("reason", Text, nullable=True),
    Column("concurrency_key", String(500), nullable=True),
    Column("parent_run_id", String(36), nullable=True),
    Column("created_at", UTCDateTime, nullable=False),
    Column("started_at", UTCDateTime, nullable=True),
    Column("finished_at", UTCDateTime, nullable=True),
    Column("deadline_at", UTCDateTime, nullable=True),
    Column("cancel_requested_at", UTCDateTime, nullable=True),
    Column("cancelled_by", String(255), nullable=True),
    # docs/design/global_workflows.md §5: the policy source whose global workflow this run is (NULL: none).
    Column("global_source", String(255), nullable=True),
    # Whether that global workflow is required: only then does the run report on the commit.
    Column("global_required", Boolean, nullable=False, server_default="0"),
    UniqueConstraint("delivery_id", "workflow", name="uq_runs_delivery_workflow"),
    UniqueConstraint("event_id", "registration_id", name="uq_runs_event_registration"),
    Index("ix_runs_created_at_id", "created_at", "id"),
    Index("ix_runs_workflow_created_at_id", "workflow", "created_at", "id"),
    Index(
        "ix_runs_active",
        "status",
        sqlite_where=text("status NOT IN ('success', 'failed', 'cancelled')"),
        postgresql_where=text("status NOT IN ('success', 'failed', 'cancelled')"),
    ),
)

jobs = Table(
    "jobs",
    metadata,
    Column("id", String(36), primary_key=True),
    Column("run_id", String(36), nullable=False),
    Column("org_id", String(64), nullable=False),
    Column("name", String(200), nullable=False),
    Column("matrix_key", String(500), nullable=False, server_default=""),
    Column("display_name", String(700), nullable=False),
    Column("matrix", JSONDocument, nullable=True),
    Column("status", String(16), nullable=False),
    Column("reason", Text, nullable=True),
    Column("blocked_on", String(32), nullable=True),
    Column("runs_on", JSONDocument, nullable=False),
    Column("environment", String(64), nullable=True),
    Column("concurrency_key", String(500), nullable=True),
    Column("timeout_ms", BigInteger, nullable=True),
    Column("agent_id", String(64), nullable=True),
    Column("instance_id", String(64), nullable=True),
    Column("outputs", JSONDocument, nullable=True),
    Column("created_at", UTCDateTime, nullable=False),
    Column("queued_at", UTCDateTime, nullable=True),
    Column("started_at", UTCDateTime, nullable=True),
    Column("finished_at", UTCDateTime, nullable=True),
    Column("last_heartbeat_at", UTCDateTime, nullable=True),
    Column("recovery_deadline", UTCDateTime, nullable=True),
    Column("cancel_deadline", UTCDateTime, nullable=True),
    Column("log_bytes", BigInteger, nullable=False, server_default="0"),
    # The dispatch attempt and offer hop whose log the job shows: the ones whose result was recorded (0022);
    # null until then, when the latest with a log is shown.
    Column("log_attempt", Integer, nullable=True),
    Column("log_hop", Integer, nullable=True),
    # Rerouting to a worker (0011, docs/design/cluster.md §4.2): who holds the job, the hop it arrived on, the
    # workers already tried, the job's spawn-retry budget, and the armed spawn window.
    Column("rerouted_to", String(64), nullable=True),
    Column("reroute_hop", Integer, nullable=True),
    Column("reroute_tried", JSONDocument, nullable=True),
    Column("reroute_spawn_max_attempts", Integer, nullable=True),
    Column("reroute_spawn_retry_backoff_ms", BigInteger, nullable=True),
    Column("reroute_spawn_failures", Integer, nullable=True),
    Column("reroute_window_expires_at", UTCDateTime, nullable=True),
    # Fan-out (0028, docs/design/execution.md §13): a fan-out job is marked `fanout`; each of its host executions
    # names it in `fanout_parent_id` and its agent in `fanout_host`.
    Column("fanout", Boolean, nullable=False, server_default="0"),
    Column("fanout_parent_id", String(36), nullable=True),
    Column("fanout_host", String(64), nullable=True),
    UniqueConstraint("run_id", "name", "matrix_key", name="uq_jobs_run_name_matrix"),
    Index("ix_jobs_run", "run_id"),
    Index(
        "ix_jobs_heartbeat",
        "last_heartbeat_at",
        sqlite_where=text("status IN ('dispatched', 'running')"),
        postgresql_where=text("status IN ('dispatched', 'running')"),
    ),
    Index(
        "ix_jobs_recovery",
        "recovery_deadline",
        sqlite_where=text("status = 'recovering'"),
        postgresql_where=text("status = 'recovering'"),
    ),
    Index(
        "ix_jobs_reroute_window",
        "reroute_window_expires_at",
        sqlite_where=text("reroute_window_expires_at IS NOT NULL"),
        postgresql_where=text("reroute_window_expires_at IS NOT NULL"),
    ),
)

job_needs = Table(
    "job_needs",
    metadata,
    Column("job_id", String(36), primary_key=True),
    Column("upstream_name", String(200), primary_key=True),
    Column("run_on", JSONDocument, nullable=False),
)

steps = Table(
    "steps",
    metadata,
    Column("job_id", String(36), primary_key=True),
    Column("step_index", Integer, primary_key=True),
    Column("name", String(200), nullable=False),
    Column("kind", String(8), nullable=False),
    Column("lock_index", Integer, nullable=True),
    Column("status", String(16), nullable=False),
    Column("reason", Text, nullable=True),
    Column("attempts", Integer, nullable=False, server_default="0"),
    Column("exit_code", Integer, nullable=True),
    Column("outputs", JSONDocument, nullable=True),
    Column("error", Text, nullable=True),
    Column("started_at", UTCDateTime, nullable=True),
    Column("finished_at", UTCDateTime, nullable=True),
    Column("duration_ms", BigInteger, nullable=True),
    Column("log_bytes", BigInteger, nullable=False, server_default="0"),
)

dispatch_queue = Table(
    "dispatch_queue",
    metadata,
    Column("job_id", String(36), primary_key=True),
    Column("run_id", String(36), nullable=False),
    Column("org_id", String(64), nullable=False),
    Column("state", String(16), nullable=False),
    Column("exact_labels", JSONDocument, nullable=False),
    Column("runs_on", JSONDocument, nullable=False),
    Column("priority", Integer, nullable=False, server_default="0"),
    Column("enqueued_at", UTCDateTime, nullable=False),
    Column("not_before", UTCDateTime, nullable=False),
    Column("expires_at", UTCDateTime, nullable=True),
    Column("attempts", Integer, nullable=False, server_default="0"),
    Column("owner_instance_id", String(64), nullable=True),
    Column("agent_id", String(64), nullable=True),
    Column("bound_agent_id", String(64), nullable=True),
    Column("claimed_at", UTCDateTime, nullable=True),
    Column("ack_deadline", UTCDateTime, nullable=True),
    Column("unschedulable", Text, nullable=True),
    Column("unschedulable_since", UTCDateTime, nullable=True),
    Column("last_provisioning_error", Text, nullable=True),
    Column("last_error", Text, nullable=True),
    # SHA-256 of the current dispatch's artifact credential (docs/design/artifacts.md §4).
    Column("job_token_hash", String(64), nullable=True, unique=True),
    Index(
        "ix_dispatch_queue_pending",
        text("priority DESC"),
        "enqueued_at",
        sqlite_where=text("state = 'pending'"),
        postgresql_where=text("state = 'pending'"),
    ),
)

dispatch_history = Table(
    "dispatch_history",
    metadata,
    Column("id", String(36), primary_key=True),
    Column("job_id", String(36), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("agent_id", String(64), nullable=True),
    Column("owner_instance_id", String(64), nullable=True),
    Column("enqueued_at", UTCDateTime, nullable=True),
    Column("claimed_at", UTCDateTime, nullable=True),
    Column("ended_at", UTCDateTime, nullable=False),
    Column("outcome", String(16), nullable=False),
    Column("detail", Text, nullable=True),
    # An offer to a worker that ended (0012, docs/design/cluster.md §4.2, §4.4): why (a NAK reason,
    # `ack-timeout`, `window`, `final`, `cap`, `session-gone`) and the hop it was offered at. Null for local
    # agents.
    Column("reason", String(32), nullable=True),
    Column("reroute_hop", Integer, nullable=True),
    Index("ix_dispatch_history_job", "job_id"),
)

job_logs = Table(
    "job_logs",
    metadata,
    Column("job_id", String(36), primary_key=True),
    # The dispatch attempt and the offer hop (0: no worker) of the execution that wrote the chunk (0022,
    # docs/design/execution.md §9): each has a log of its own, and the job shows the one that counts.
    Column("attempt", Integer, primary_key=True, server_default="1"),
    Column("hop", Integer, primary_key=True, server_default="0"),
    Column("step_index", Integer, primary_key=True),
    Column("seq", Integer, primary_key=True),
    Column("byte_offset", BigInteger, nullable=False),
    Column("job_offset", BigInteger, nullable=False),
    Column("job_prefix", Text, nullable=True),
    Column("bytes", Integer, nullable=False),
    Column("line_count", Integer, nullable=False),
    Column("data", LargeBinary, nullable=False),
    Column("meta", JSONDocument, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Index("ix_job_logs_step_offset", "job_id", "attempt", "hop", "step_index", "byte_offset"),
    Index("ix_job_logs_job_offset", "job_id", "attempt", "hop", "job_offset"),
)

agents = Table(
    "agents",
    metadata,
    Column("agent_id", String(64), primary_key=True),
    Column("org_id", String(64), nullable=False),
    Column("token_id", String(36), nullable=True),
    Column("labels", JSONDocument, nullable=False),
    Column("mandatory_labels", JSONDocument, nullable=False),
    Column("capacity", Integer, nullable=False),
    Column("version", String(64), nullable=True),
    Column("hostname", String(255), nullable=True),
    Column("os", String(32), nullable=True),
    Column("arch", String(32), nullable=True),
    Column("ephemeral", Boolean, nullable=False, server_default="0"),
    Column("instance_id", String(64), nullable=True),
    Column("state", String(16), nullable=False),
    Column("first_seen_at", UTCDateTime, nullable=False),
    Column("connected_at", UTCDateTime, nullable=True),
    Column("last_seen_at", UTCDateTime, nullable=True),
    Column("disconnected_at", UTCDateTime, nullable=True),
    Column("last_close_code", Integer, nullable=True),
)

agent_tokens = Table(
    "agent_tokens",
    metadata,
    Column("id", String(36), primary_key=True),
    Column("org_id", String(64), nullable=False),
    Column("label", String(100), nullable=True),
    Column("kind", String(16), nullable=False),
    Column("token_hash", String(64), nullable=False, unique=True),
    Column("prefix", String(16), nullable=False),
    Column("labels", JSONDocument, nullable=False),
    Column("mandatory_labels", JSONDocument, nullable=False),
    Column("agent_id", String(64), nullable=True),
    Column("single_use", Boolean, nullable=False, server_default="0"),
    Column("consumed_at", UTCDateTime, nullable=True),
    Column("created_by", String(64), nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Column("expires_at", UTCDateTime, nullable=True),
    Column("revoked_at", UTCDateTime, nullable=True),
    Column("last_used_at", UTCDateTime, nullable=True),
)

concurrency_groups = Table(
    "concurrency_groups",
    metadata,
    Column("scope", String(8), primary_key=True),
    Column("owner", String(500), primary_key=True),
    Column("group_key", String(500), primary_key=True),
    Column("updated_at", UTCDateTime, nullable=False),
)

status_reports = Table(
    "status_reports",
    metadata,
    Column("source_id", String(36), primary_key=True),
    Column("sha", String(64), primary_key=True),
    Column("context", String(500), primary_key=True),
    Column("run_id", String(36), nullable=False),
    Column("job_id", String(36), nullable=True),
    Column("state", String(16), nullable=False),
    Column("description", String(140), nullable=True),
    Column("target_url", Text, nullable=True),
    Column("version", Integer, nullable=False),
    Column("sent_version", Integer, nullable=False, server_default="0"),
    Column("external_id", String(100), nullable=True),
    Column("attempts", Integer, nullable=False, server_default="0"),
    Column("next_attempt_at", UTCDateTime, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
)

run_timeline = Table(
    "run_timeline",
    metadata,
    Column("id", String(36), primary_key=True),
    Column("run_id", String(36), nullable=False),
    Column("job_id", String(36), nullable=True),
    Column("at", UTCDateTime, nullable=False),
    Column("source", String(16), nullable=False),
    Column("kind", String(64), nullable=False),
    Column("detail", JSONDocument, nullable=True),
    Index("ix_run_timeline_run", "run_id", "at"),
)


# --- Dispatch extras (migration 0004) ---

# Since when a ready job waits for its concurrency group or `max_parallel` (docs/design/execution.md §8.3).
jobs.append_column(Column("blocked_since", UTCDateTime, nullable=True))


# --- Events (migration 0005) ---

_UNFINISHED = "processed_at IS NULL AND dlq_at IS NULL"

events = Table(
    "events",
    metadata,
    Column("id", String(36), primary_key=True),
    Column("name", String(255), nullable=False),
    Column("origin", String(16), nullable=False),
    Column("org_id", String(64), nullable=True),
    Column("payload", JSONDocument, nullable=False),
    Column("source_routing_key", String(255), nullable=True),
    Column("source_repo", String(500), nullable=True),
    Column("source_run_id", String(36), nullable=True),
    Column("source_job_id", String(36), nullable=True),
    Column("target_repos", JSONDocument, nullable=True),
    Column("chain_depth", Integer, nullable=False, server_default="0"),
    Column("attempts", Integer, nullable=False, server_default="0"),
    Column("dedup_key", String(500), nullable=True, unique=True),
    Column("created_at", UTCDateTime, nullable=False),
    Column("lease_owner", String(64), nullable=True),
    Column("lease_expires_at", UTCDateTime, nullable=True),
    Column("next_retry_at", UTCDateTime, nullable=True),
    Column("last_error", Text, nullable=True),
    Column("processed_at", UTCDateTime, nullable=True),
    Column("match_outcome", String(32), nullable=True),
    Column("matched_count", Integer, nullable=True),
    Column("dlq_at", UTCDateTime, nullable=True),
    Column("dlq_reason", String(32), nullable=True),
    Index("ix_events_created", text("created_at DESC"), text("id DESC")),
    Index("ix_events_name_created", "name", text("created_at DESC"), text("id DESC")),
    Index("ix_events_source_name_created", "source_routing_key", "name", "created_at"),
    Index(
        "ix_events_unfinished",
        "created_at",
        "id",
        sqlite_where=text(_UNFINISHED),
        postgresql_where=text(_UNFINISHED),
    ),
    Index(
        "ix_events_leased",
        "lease_expires_at",
        sqlite_where=text(_UNFINISHED + " AND lease_owner IS NOT NULL"),
        postgresql_where=text(_UNFINISHED + " AND lease_owner IS NOT NULL"),
    ),
    Index(
        "ix_events_dlq",
        text("dlq_at DESC"),
        text("id DESC"),
        sqlite_where=text("dlq_at IS NOT NULL"),
        postgresql_where=text("dlq_at IS NOT NULL"),
    ),
)

workflow_registrations = Table(
    "workflow_registrations",
    metadata,
    Column("id", String(36), primary_key=True),
    Column("org_id", String(64), nullable=False),
    Column("routing_key", String(255), nullable=False),
    Column("repo", String(500), nullable=False),
    Column("workflow_name", String(200), nullable=False),
    Column("source_file", String(500), nullable=True),
    Column("lock_entry", JSONDocument, nullable=False),
    Column("content_hash", String(128), nullable=True),
    Column("commit_sha", String(64), nullable=True),
    Column("default_branch", String(255), nullable=True),
    Column("provider_context", JSONDocument, nullable=True),
    Column("is_global", Boolean, nullable=False, server_default="0"),
    Column("disabled", Boolean, nullable=False, server_default="0"),
    Column("created_at", UTCDateTime, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
    UniqueConstraint("routing_key", "repo", "workflow_name", name="uq_workflow_registrations_key"),
    Index("ix_workflow_registrations_org", "org_id"),
)

registration_triggers = Table(
    "registration_triggers",
    metadata,
    Column(
        "registration_id",
        String(36),
        ForeignKey("workflow_registrations.id", ondelete="CASCADE"),
        primary_key=True,
    ),
    Column("kind", String(32), primary_key=True),
    Index("ix_registration_triggers_kind", "kind"),
)

cron_schedules = Table(
    "cron_schedules",
    metadata,
    Column(
        "registration_id",
        String(36),
        ForeignKey("workflow_registrations.id", ondelete="CASCADE"),
        primary_key=True,
    ),
    Column("schedule_key", String(300), primary_key=True),
    Column("cron", String(200), nullable=False),
    Column("timezone", String(100), nullable=False),
    Column("armed_at", UTCDateTime, nullable=False),
)

cron_fires = Table(
    "cron_fires",
    metadata,
    Column("registration_id", String(36), primary_key=True),
    Column("schedule_key", String(300), primary_key=True),
    Column("slot_at", UTCDateTime, primary_key=True),
    Column("fired_at", UTCDateTime, nullable=False),
    Column("event_id", String(36), nullable=True),
    ForeignKeyConstraint(
        ["registration_id", "schedule_key"],
        ["cron_schedules.registration_id", "cron_schedules.schedule_key"],
        name="fk_cron_fires_schedule",
        ondelete="CASCADE",
    ),
)

event_trust = Table(
    "event_trust",
    metadata,
    Column("id", String(36), primary_key=True),
    Column("org_id", String(64), nullable=False),
    Column("source_routing_key", String(255), nullable=False),
    Column("source_repo", String(500), nullable=False),
    Column("target_routing_key", String(255), nullable=False),
    Column("target_repo", String(500), nullable=False),
    Column("event_names", JSONDocument, nullable=False),
    Column("enabled", Boolean, nullable=False, server_default="1"),
    Column("created_at", UTCDateTime, nullable=False),
    Column("created_by", String(64), nullable=True),
    UniqueConstraint(
        "org_id",
        "source_routing_key",
        "source_repo",
        "target_routing_key",
        "target_repo",
        name="uq_event_trust_key",
    ),
)

event_batch_windows = Table(
    "event_batch_windows",
    metadata,
    Column("id", String(36), primary_key=True),
    Column(
        "registration_id",
        String(36),
        ForeignKey("workflow_registrations.id", ondelete="CASCADE"),
        nullable=False,
        unique=True,
    ),
    Column("org_id", String(64), nullable=False),
    Column("routing_key", String(255), nullable=False),
    Column("repo", String(500), nullable=False),
    Column("opened_at", UTCDateTime, nullable=False),
    Column("closes_at", UTCDateTime, nullable=False),
    Index("ix_event_batch_windows_closes", "closes_at"),
)

event_batch_items = Table(
    "event_batch_items",
    metadata,
    Column(
        "window_id",
        String(36),
        ForeignKey("event_batch_windows.id", ondelete="CASCADE"),
        primary_key=True,
    ),
    Column("run_id", String(36), primary_key=True),
    Column("repo", String(500), nullable=False),
    Column("workflow_name", String(200), nullable=False),
    Column("failure_class", String(100), nullable=True),
    Column("sender", String(255), nullable=True),
    Column("chain_depth", Integer, nullable=False, server_default="0"),
    Column("added_at", UTCDateTime, nullable=False),
)


# --- Scaler (migration 0006) ---

# Live spawns of this node's scaler manager (docs/design/scaler.md §8); a row leaves for the history when it
# ends.
scaler_spawns = Table(
    "scaler_spawns",
    metadata,
    Column("agent_id", String(64), primary_key=True),
    Column("node_id", String(64), nullable=False),
    Column("boot_id", String(36), nullable=False),
    Column("scaler", String(64), nullable=False),
    Column("backend_type", String(32), nullable=False),
    Column("label_set", JSONDocument, nullable=False),
    Column("backend_ref", String(255), nullable=True),
    Column("bound_job_id", String(36), nullable=True),
    Column("run_id", String(36), nullable=True),
    Column("org_id", String(64), nullable=True),
    Column("warm", Boolean, nullable=False, server_default="0"),
    Column("state", String(16), nullable=False),
    Column("cpus", Float, nullable=False, server_default="0"),
    Column("mem_bytes", BigInteger, nullable=False, server_default="0"),
    Column("token_id", String(36), nullable=True),
    Column("spawned_at", UTCDateTime, nullable=False),
    Column("deadline_at", UTCDateTime, nullable=False),
    Column("registered_at", UTCDateTime, nullable=True),
    # The leader that adopted the record of a node that is not live (the backstop, migration 0013).
    Column("adopted_by", String(64), nullable=True),
    Column("adopted_at", UTCDateTime, nullable=True),
    Index("ix_scaler_spawns_node", "node_id"),
    Index("ix_scaler_spawns_bound_job_id", "bound_job_id"),
)

scaler_spawn_history = Table(
    "scaler_spawn_history",
    metadata,
    Column("agent_id", String(64), primary_key=True),
    Column("node_id", String(64), nullable=False),
    Column("boot_id", String(36), nullable=False),
    Column("scaler", String(64), nullable=False),
    Column("backend_type", String(32), nullable=False),
    Column("label_set", JSONDocument, nullable=False),
    Column("backend_ref", String(255), nullable=True),
    Column("bound_job_id", String(36), nullable=True),
    Column("run_id", String(36), nullable=True),
    Column("org_id", String(64), nullable=True),
    Column("warm", Boolean, nullable=False, server_default="0"),
    Column("cpus", Float, nullable=False, server_default="0"),
    Column("mem_bytes", BigInteger, nullable=False, server_default="0"),
    Column("token_id", String(36), nullable=True),
    Column("spawned_at", UTCDateTime, nullable=False),
    Column("deadline_at", UTCDateTime, nullable=False),
    Column("registered_at", UTCDateTime, nullable=True),
    Column("ended_at", UTCDateTime, nullable=False),
    Column("outcome", String(32), nullable=False),
    Column("error", Text, nullable=True),
    Column("log_tail", JSONDocument, nullable=True),
    Column("adopted_by", String(64), nullable=True),
    Index("ix_scaler_spawn_history_ended_at", "ended_at"),
)

# Firecracker guest addresses handed out by coordinators (docs/design/scaler.md §6.3).
scaler_claims = Table(
    "scaler_claims",
    metadata,
    Column("agent_id", String(64), primary_key=True),
    Column("code_sha256", String(64), nullable=False, unique=True),
    Column("scaler", String(64), nullable=False),
    Column("url", Text, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Column("expires_at", UTCDateTime, nullable=False),
    Column("consumed_at", UTCDateTime, nullable=True),
    Index("ix_scaler_claims_expires_at", "expires_at"),
)

ip_allocations = Table(
    "ip_allocations",
    metadata,
    Column("ip", String(64), primary_key=True),
    Column("vm_id", String(64), nullable=False, unique=True),
    Column("node_id", String(64), nullable=False),
    Column("allocated_at", UTCDateTime, nullable=False),
)

# --- dashboard (0009)

# A signed-in browser: the cookie's secret is stored only as SHA-256; the token is re-checked on every request.
dashboard_sessions = Table(
    "dashboard_sessions",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("token_id", String(36), nullable=False),
    Column("csrf_token", String(64), nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Column("last_seen_at", UTCDateTime, nullable=False),
    Column("remote_addr", String(64), nullable=True),
    Index("ix_dashboard_sessions_token_id", "token_id"),
    Index("ix_dashboard_sessions_last_seen_at", "last_seen_at"),
)

# --- cluster peers (0010, docs/design/cluster.md §2.2)

join_tokens = Table(
    "join_tokens",
    metadata,
    Column("id", String(36), primary_key=True),
    Column("token_hash", String(64), nullable=False, unique=True),
    Column("role", String(16), nullable=False),
    Column("created_by", String(64), nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Column("expires_at", UTCDateTime, nullable=False),
    Column("consumed_at", UTCDateTime, nullable=True),
    Column("consumed_by_instance", String(64), nullable=True),
    Column("revoked_at", UTCDateTime, nullable=True),
    CheckConstraint("role IN ('coordinator', 'worker')", name="role"),
    Index("ix_join_tokens_expires_at", "expires_at"),
)

peer_credentials = Table(
    "peer_credentials",
    metadata,
    Column("id", String(36), primary_key=True),
    Column("instance_id", String(64), nullable=False),
    Column("role", String(16), nullable=False),
    Column("stored_key", LargeBinary, nullable=False),
    Column("server_key", LargeBinary, nullable=False),
    Column("join_token_id", String(36), nullable=True),
    Column("created_at", UTCDateTime, nullable=False),
    Column("expires_at", UTCDateTime, nullable=False),
    Column("rotated_at", UTCDateTime, nullable=True),
    Column("revoked_at", UTCDateTime, nullable=True),
    Column("last_seen_at", UTCDateTime, nullable=True),
    Column("last_validated_by", String(64), nullable=True),
    CheckConstraint("role IN ('coordinator', 'worker')", name="role"),
    Index("ix_peer_credentials_instance_id", "instance_id"),
    # One active credential per instance: a second join or rotation supersedes the first in the same
    # transaction, and concurrent ones on two coordinators cannot both win.
    Index(
        "uq_peer_credentials_active",
        "instance_id",
        unique=True,
        sqlite_where=text("rotated_at IS NULL AND revoked_at IS NULL"),
        postgresql_where=text("rotated_at IS NULL AND revoked_at IS NULL"),
    ),
)

# Artifacts and the blob store (docs/design/artifacts.md §3).
blobs = Table(
    "blobs",
    metadata,
    Column("sha256", String(64), primary_key=True),
    Column("size", BigInteger, nullable=False),
    Column("state", String(8), nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Column("touched_at", UTCDateTime, nullable=False),
    CheckConstraint("state IN ('live', 'doomed')", name="state"),
    Index("ix_blobs_touched_at", "touched_at"),
)

artifact_uploads = Table(
    "artifact_uploads",
    metadata,
    Column("id", String(36), primary_key=True),
    Column("job_id", String(36), nullable=False),
    Column("run_id", String(36), nullable=False),
    Column("sha256", String(64), nullable=False),
    Column("size", BigInteger, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Index("ix_artifact_uploads_created_at", "created_at"),
    Index("ix_artifact_uploads_sha256", "sha256"),
)

artifacts = Table(
    "artifacts",
    metadata,
    Column("id", String(36), primary_key=True),
    Column("org_id", String(64), nullable=False),
    Column("run_id", String(36), nullable=False),
    Column("job_id", String(36), nullable=False),
    Column("routing_key", String(255), nullable=True),
    Column("name", String(128), nullable=False),
    Column("format", String(8), nullable=False),
    Column("filename", String(255), nullable=True),
    Column("size", BigInteger, nullable=False),
    Column("blob_sha256", String(64), nullable=False),
    Column("file_count", Integer, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Column("expires_at", UTCDateTime, nullable=True),
    UniqueConstraint("run_id", "name", name="uq_artifacts_run_name"),
    CheckConstraint("format IN ('file', 'tar')", name="format"),
    Index("ix_artifacts_blob_sha256", "blob_sha256"),
    Index("ix_artifacts_expires_at", "expires_at"),
)

# docs/design/artifacts.md §9: the public half of every provenance signing key a coordinator used (never
# deleted: old statements keep verifying), and one signed statement (a DSSE envelope) per artifact.
provenance_keys = Table(
    "provenance_keys",
    metadata,
    Column("key_id", String(64), primary_key=True),
    Column("algorithm", String(16), nullable=False),
    Column("public_key", Text, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
)

provenance_statements = Table(
    "provenance_statements",
    metadata,
    Column("artifact_id", String(36), primary_key=True),
    Column("run_id", String(36), nullable=False),
    Column("key_id", String(64), nullable=False),
    Column("envelope", Text, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Index("ix_provenance_statements_run_id", "run_id"),
)

# docs/design/caches.md §4: dependency cache entries, immutable once inserted.
cache_entries = Table(
    "cache_entries",
    metadata,
    Column("id", String(36), primary_key=True),
    Column("org_id", String(64), nullable=False),
    Column("source", String(200), nullable=False),
    Column("repo", String(500), nullable=False),
    Column("scope", String(500), nullable=False),
    Column("key", String(512), nullable=False),
    Column("blob_sha256", String(64), nullable=False),
    Column("size", BigInteger, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Column("last_used_at", UTCDateTime, nullable=False),
    Column("created_by_job_id", String(36), nullable=True),
    UniqueConstraint("org_id", "source", "repo", "scope", "key", name="uq_cache_entries_key"),
    Index("ix_cache_entries_last_used", "org_id", "source", "repo", "last_used_at"),
    Index("ix_cache_entries_blob_sha256", "blob_sha256"),
)

# docs/design/caches.md §7: what each step's `ctx.cache` did (the lookup's answer, then the save), for the run
# page. A row per (job, step, key): `kind` is exact|partial|miss (None: the lookup never reached the server),
# `saved` is saved|dropped (None: no save was committed).
step_caches = Table(
    "step_caches",
    metadata,
    Column("job_id", String(36), primary_key=True),
    Column("step_index", Integer, primary_key=True),
    Column("key", String(512), primary_key=True),
    Column("kind", String(8), nullable=True),
    Column("restored_key", String(512), nullable=True),
    Column("saved", String(8), nullable=True),
    Column("saved_size", BigInteger, nullable=True),
    Column("updated_at", UTCDateTime, nullable=False),
)

test_reports = Table(
    "test_reports",
    metadata,
    Column("id", String(36), primary_key=True),
    Column("run_id", String(36), nullable=False),
    Column("job_id", String(36), nullable=False),
    Column("artifact_id", String(36), nullable=True),
    Column("name", String(128), nullable=False),
    Column("passed", Integer, nullable=False),
    Column("failed", Integer, nullable=False),
    Column("skipped", Integer, nullable=False),
    Column("errors", Integer, nullable=False),
    Column("failures", JSONDocument, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Index("ix_test_reports_run_id", "run_id"),
)

# --- notification rules (0019; docs/design/events.md §10)

notification_rules = Table(
    "notification_rules",
    metadata,
    Column("id", String(36), primary_key=True),
    Column("org_id", String(64), nullable=False),
    # NULL: every source of the org.
    Column("source_id", String(36), ForeignKey("sources.id", ondelete="CASCADE"), nullable=True),
    Column("on_events", JSONDocument, nullable=False),  # subset of failed, fixed, succeeded
    Column("workflow", String(200), nullable=True),
    Column("ref_glob", String(500), nullable=True),
    Column("target_kind", String(16), nullable=False),
    Column("target", Text, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Column("created_by", String(64), nullable=True),
    Index("ix_notification_rules_org_id", "org_id"),
    CheckConstraint("target_kind IN ('email', 'webhook')", name="target_kind"),
)


# --- Approvals (migration 0020, docs/design/approvals.md)

# An environment's protection rule (NULL = unprotected), a job's approve/reject decision, and the token that
# started a run (for `prevent_self_approval`).
environments.append_column(Column("protection", JSONDocument, nullable=True))
jobs.append_column(Column("approval", JSONDocument, nullable=True))
runs.append_column(Column("triggered_by", String(64), nullable=True))
Index(
    "ix_jobs_waiting_approval",
    jobs.c.blocked_since,
    sqlite_where=text("status = 'waiting_approval'"),
    postgresql_where=text("status = 'waiting_approval'"),
)


# --- Fork pull requests (migration 0021, docs/design/approvals.md §6)

# `hold` (default) | `run-without-secrets` | `refuse`; a run's hold (`fork pull request`) until approved.
sources.append_column(Column("fork_pull_requests", String(24), nullable=False, server_default="hold"))
runs.append_column(Column("held", String(100), nullable=True))


# --- Summoned runs (migration 0029, docs/design/execution.md §8.6)

# The run and job whose step summoned this run, and `<job_id>:<request_id>` (a resend starts nothing twice).
runs.append_column(Column("summoned_by_run_id", String(36), nullable=True))
runs.append_column(Column("summoned_by_job_id", String(36), nullable=True))
runs.append_column(Column("summon_key", String(120), nullable=True))
runs.append_constraint(UniqueConstraint("summon_key", name="uq_runs_summon_key"))
Index("ix_runs_summoned_by_run_id", runs.c.summoned_by_run_id)
Index("ix_runs_summoned_by_job_id", runs.c.summoned_by_job_id)
