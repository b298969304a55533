"""Fleet knobs (`cluster_settings`, docs/design/cluster.md §5.1) and per-org knobs (`org_settings`,
docs/design/cluster.md §6) as data.

Each knob has a built-in default, an inclusive range and an env default `CONVEYOR_<NAME>` that
overrides the built-in one; a database value overrides both.
"""

from __future__ import annotations

from dataclasses import dataclass

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB
SECOND_MS = 1000
MINUTE_MS = 60 * SECOND_MS
HOUR_MS = 60 * MINUTE_MS
DAY_MS = 24 * HOUR_MS


@dataclass(frozen=True)
class Knob:
    """One integer setting: its default (None = unlimited) and inclusive bounds."""

    name: str
    default: int | None
    minimum: int
    maximum: int
    group: str

    def describe_range(self) -> str:
        """Human form of the allowed range, for error messages."""
        return f"{self.name} must be between {self.minimum} and {self.maximum}"


CLUSTER_KNOBS: tuple[Knob, ...] = (
    Knob("max_webhook_payload_bytes", 25 * MIB, KIB, 100 * MIB, "ingest"),
    Knob("lock_file_max_bytes", 5 * MIB, KIB, 50 * MIB, "ingest"),
    Knob("webhook_dedup_ttl_ms", DAY_MS, MINUTE_MS, 30 * DAY_MS, "ingest"),
    # docs/design/execution.md §1.1: what the event log keeps of an ended delivery's body.
    Knob("event_log_max_payload_bytes", MIB, KIB, 100 * MIB, "ingest"),
    # docs/design/execution.md §1.1: bounds of the content and lock-file caches (0 entries: keep none).
    Knob("content_cache_max", 1000, 0, 1_000_000, "ingest"),
    Knob("content_cache_max_bytes", 64 * MIB, KIB, 4 * GIB, "ingest"),
    Knob("content_cache_ttl_ms", HOUR_MS, SECOND_MS, 7 * DAY_MS, "ingest"),
    Knob("lockfile_cache_max", 500, 0, 100_000, "ingest"),
    Knob("lockfile_cache_max_bytes", 64 * MIB, KIB, 4 * GIB, "ingest"),
    Knob("lockfile_cache_ttl_ms", HOUR_MS, SECOND_MS, 7 * DAY_MS, "ingest"),
    Knob("queue_max_depth", 1000, 1, 1_000_000, "dispatch"),
    Knob("unroutable_grace_ms", 120 * SECOND_MS, 0, DAY_MS, "dispatch"),
    Knob("concurrency_wait_timeout_ms", HOUR_MS, SECOND_MS, 7 * DAY_MS, "dispatch"),
    # docs/design/execution.md §13: more connected agents matching a fan-out job than this fails it at queue time.
    Knob("max_fanout_hosts", 10, 1, 1000, "dispatch"),
    Knob("event_router_event_ttl_seconds", 604_800, 60, 31_536_000, "event router"),
    Knob("event_router_max_dispatch_attempts", 5, 1, 50, "event router"),
    Knob("event_router_rate_limit_per_workflow_per_minute", 100, 1, 100_000, "event router"),
    Knob("event_max_payload_bytes", 64 * KIB, KIB, MIB, "event router"),
    Knob("reroute_ack_timeout_ms", 15 * SECOND_MS, SECOND_MS, 120 * SECOND_MS, "reroute"),
    Knob("reroute_max_hops", 3, 1, 10, "reroute"),
    Knob("reroute_spawn_window_ms", 90 * SECOND_MS, 5 * SECOND_MS, HOUR_MS, "reroute"),
    Knob("reroute_spawn_max_attempts", 3, 1, 10, "reroute"),
    Knob("reroute_spawn_retry_backoff_ms", 5 * SECOND_MS, 0, 10 * MINUTE_MS, "reroute"),
    Knob("reroute_flap_grace_ms", 120 * SECOND_MS, SECOND_MS, HOUR_MS, "reroute"),
    # docs/design/cluster.md §4.4: how long the owner's check of a job it believes it owns may wait for the
    # job's row locks before it defers (and looks again) rather than wait on.
    Knob("ownership_db_check_timeout_ms", 5 * SECOND_MS, 100, MINUTE_MS, "reroute"),
    Knob("agent_token_ttl_ms", HOUR_MS, MINUTE_MS, DAY_MS, "agents, scaler"),
    Knob("firecracker_api_socket_wait_ms", 5 * SECOND_MS, 100, 60 * SECOND_MS, "agents, scaler"),
    Knob("scaler_reap_interval_ms", 60 * SECOND_MS, 5 * SECOND_MS, HOUR_MS, "agents, scaler"),
    Knob("scaler_reap_stranded_timeout_ms", 30 * MINUTE_MS, MINUTE_MS, DAY_MS, "agents, scaler"),
    Knob("scaler_provision_backoff_base_ms", 30 * SECOND_MS, SECOND_MS, HOUR_MS, "agents, scaler"),
    Knob("scaler_provision_backoff_max_ms", 15 * MINUTE_MS, SECOND_MS, DAY_MS, "agents, scaler"),
    Knob("scaler_provision_max_consecutive_failures", 5, 1, 100, "agents, scaler"),
    # docs/design/scaler.md §3, "Teardown reattempts": a teardown that failed is tried again this often.
    Knob("scaler_reap_reattempt_interval_ms", 30 * SECOND_MS, SECOND_MS, HOUR_MS, "agents, scaler"),
    # docs/design/scaler.md §6.4: consumed and expired event-backend claims are kept this long (0: purged
    # at the next reap).
    Knob("scaler_claim_retention_ms", DAY_MS, 0, 365 * DAY_MS, "agents, scaler"),
    Knob("run_retention_days", 90, 0, 3650, "retention"),
    Knob("audit_retention_days", 365, 0, 3650, "retention"),
    # docs/design/execution.md §10.1: sent status-report (check-run tracking) rows (0: kept with the run).
    Knob("check_run_tracking_ttl_days", 30, 0, 3650, "retention"),
    # docs/design/approvals.md §4: how long a job waits for approval before the sweep cancels it.
    Knob("held_run_retention_days", 30, 0, 3650, "retention"),
    # docs/design/artifacts.md §6: 5 GiB is the largest object one S3 copy places.
    Knob("artifact_max_bytes", GIB, KIB, 5 * GIB, "artifacts"),
    Knob("artifact_run_max_bytes", 10 * GIB, KIB, 1024 * GIB, "artifacts"),
    Knob("artifact_retention_days", 30, 0, 3650, "artifacts"),
    # docs/design/artifacts.md §9: 0 keeps a provenance statement as long as its artifact.
    Knob("provenance_retention_days", 0, 0, 3650, "artifacts"),
    # docs/design/caches.md §6: an entry is one blob, so the same 5 GiB ceiling as an artifact.
    Knob("cache_max_entry_bytes", 2 * GIB, KIB, 5 * GIB, "caches"),
    Knob("cache_max_total_bytes", 10 * GIB, KIB, 1024 * GIB, "caches"),
    Knob("cache_ttl_days", 7, 1, 3650, "caches"),
    # docs/design/global_workflows.md §4, §6: the bounds of one delivery's evaluation of global workflows.
    Knob("global_eval_round_timeout_ms", 2 * SECOND_MS, 1, MINUTE_MS, "global workflows"),
    Knob("global_eval_candidate_timeout_ms", 500, 1, MINUTE_MS, "global workflows"),
    Knob("global_eval_cache_max", 1024, 1, 1_000_000, "global workflows"),
    Knob("global_eval_wait_timeout_ms", 5 * SECOND_MS, 0, 10 * MINUTE_MS, "global workflows"),
)

# Knobs that exist only per organisation (their fallback is the env default, then the built-in one).
ORG_ONLY_KNOBS: tuple[Knob, ...] = (
    Knob("dispatch_ack_timeout_ms", 10 * SECOND_MS, SECOND_MS, 10 * MINUTE_MS, "org"),
    Knob("scaler_spawn_timeout_ms", 5 * MINUTE_MS, 10 * SECOND_MS, HOUR_MS, "org"),
    Knob("queue_timeout_ms", HOUR_MS, 0, 7 * DAY_MS, "org"),
    Knob("ingest_max_concurrency", None, 1, 1000, "org"),
)

# Cluster knobs an org may override (same ranges as the cluster knob).
ORG_OVERRIDABLE_CLUSTER_KNOBS: tuple[str, ...] = (
    "reroute_spawn_window_ms",
    "reroute_ack_timeout_ms",
    "reroute_max_hops",
    "reroute_spawn_max_attempts",
    "reroute_spawn_retry_backoff_ms",
    "artifact_max_bytes",
    "artifact_run_max_bytes",
    "artifact_retention_days",
    "cache_max_entry_bytes",
    "cache_max_total_bytes",
    "cache_ttl_days",
)

# The knobs a worker applies, carried in its settings snapshot (docs/design/cluster.md §5.3).
WORKER_SNAPSHOT_KNOBS: tuple[str, ...] = tuple(k.name for k in CLUSTER_KNOBS if k.group == "agents, scaler")

CLUSTER_KNOBS_BY_NAME: dict[str, Knob] = {k.name: k for k in CLUSTER_KNOBS}
ORG_KNOBS_BY_NAME: dict[str, Knob] = {
    **{name: CLUSTER_KNOBS_BY_NAME[name] for name in ORG_OVERRIDABLE_CLUSTER_KNOBS},
    **{k.name: k for k in ORG_ONLY_KNOBS},
}
ALL_KNOBS: tuple[Knob, ...] = CLUSTER_KNOBS + ORG_ONLY_KNOBS
