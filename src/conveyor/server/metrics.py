"""Prometheus metrics of one server process, in a registry of its own (several apps may share a test process)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from conveyor.execution import depth as execution_depth
from conveyor.version import COMMIT, VERSION


class Metrics:
    """The process's collectors; domain packages get the ones they update passed in."""

    def __init__(self, role: str) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.build_info = Gauge(
            "conveyor_build_info", "Build information", ["version", "commit", "role"], registry=r
        )
        self.build_info.labels(VERSION, COMMIT, role).set(1)
        self.http_requests = Counter(
            "conveyor_http_requests_total", "HTTP requests", ["route", "method", "status"], registry=r
        )
        self.http_duration = Histogram(
            "conveyor_http_request_duration_seconds",
            "HTTP request duration",
            ["route", "method", "status"],
            registry=r,
        )
        self.admin_auth_failures = Counter(
            "conveyor_admin_auth_failures_total", "Refused admin requests", ["reason"], registry=r
        )
        self.access_log_dropped = Counter(
            "conveyor_access_log_dropped_total", "Access-log read rows dropped", registry=r
        )
        self.db_errors = Counter("conveyor_db_errors_total", "Database errors", ["operation"], registry=r)
        self.leader = Gauge("conveyor_leader", "1 while this node holds the leader lease", registry=r)
        self.leader_epoch = Gauge("conveyor_leader_epoch", "Epoch of the lease this node holds", registry=r)
        self.cluster_settings_read_errors = Counter(
            "conveyor_cluster_settings_read_errors_total",
            "Failed cluster/org settings reads (the last good row was served)",
            registry=r,
        )

        self.peer_connected = Gauge(
            "conveyor_peer_connected",
            "1 while a peer has an authenticated session",
            ["peer", "role"],
            registry=r,
        )
        self.peer_auth_failures = Counter(
            "conveyor_peer_auth_failures_total", "Refused peer authentications", ["reason"], registry=r
        )
        self.retention_deleted = Counter(
            "conveyor_retention_deleted_total",
            "Rows deleted by the retention sweep (runs and their children, access log, deliveries)",
            ["kind"],
            registry=r,
        )

    def render(self) -> bytes:
        """The Prometheus text exposition (this server's collectors, then the execution package's)."""
        return generate_latest(self.registry) + generate_latest(execution_depth.REGISTRY)
