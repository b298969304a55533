"""Prometheus metrics of the scaler (docs/design/scaler.md §9), registered in the server's registry."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector


class ScalerMetrics:
    """Counters updated by the manager and the orphans handler; gauges read from the manager on scrape."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.spawns = Counter(
            "conveyor_scaler_spawns_total", "Spawns by outcome", ["scaler", "outcome"], registry=r
        )
        self.spawn_failures = Counter(
            "conveyor_scaler_spawn_failures_total", "Provisioning failures", ["scaler", "bound"], registry=r
        )
        self.spawn_refusals = Counter(
            "conveyor_scaler_spawn_refusals_total", "Spawn requests refused", ["scaler", "reason"], registry=r
        )
        self.spawn_to_register = Histogram(
            "conveyor_scaler_spawn_to_register_seconds",
            "Seconds from spawn to registration",
            ["scaler"],
            buckets=(0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600),
            registry=r,
        )
        self.config_reloads = Counter(
            "conveyor_scaler_config_reloads_total", "Configuration reloads", ["result"], registry=r
        )
        self.orphans_stopped = Counter(
            "conveyor_scaler_orphans_stopped_total", "Orphans stopped", ["backend"], registry=r
        )

    def watch(self, manager: Any) -> None:
        """Expose the manager's live state as gauges."""
        self.registry.register(_ManagerGauges(manager))


class _ManagerGauges(Collector):
    def __init__(self, manager: Any) -> None:
        self.manager = manager

    def collect(self) -> Iterator[GaugeMetricFamily]:
        agents = GaugeMetricFamily(
            "conveyor_scaler_agents", "Spawned agents", labels=["scaler", "state", "warm"]
        )
        failures = GaugeMetricFamily(
            "conveyor_scaler_consecutive_failures", "Consecutive provisioning failures", labels=["scaler"]
        )
        idle = GaugeMetricFamily("conveyor_scaler_warm_pool_idle", "Idle warm agents", labels=["scaler"])
        target = GaugeMetricFamily("conveyor_scaler_warm_pool_target", "Warm pool size", labels=["scaler"])
        cpus = GaugeMetricFamily(
            "conveyor_scaler_cpus_used", "CPUs requested by live spawns", labels=["scaler"]
        )
        memory = GaugeMetricFamily(
            "conveyor_scaler_memory_bytes_used", "Memory requested by live spawns", labels=["scaler"]
        )
        total_cpus = total_memory = 0.0
        counts: dict[tuple[str, str, str], int] = {}
        for spawn in list(self.manager.spawns.values()):
            if spawn.ended:
                continue
            state = "running" if spawn.registered else "spawning"
            key = (spawn.scaler, state, "true" if spawn.warm else "false")
            counts[key] = counts.get(key, 0) + 1
        for (scaler, state, warm), count in sorted(counts.items()):
            agents.add_metric([scaler, state, warm], count)
        for status in self.manager.status():
            name = status["name"]
            failures.add_metric([name], status["backoff"]["consecutive_failures"])
            idle.add_metric([name], status["warm_idle"])
            target.add_metric([name], status["warm_target"])
            cpus.add_metric([name], status["cpus_used"])
            memory.add_metric([name], status["memory_bytes_used"])
            total_cpus += status["cpus_used"]
            total_memory += status["memory_bytes_used"]
        cpus.add_metric(["__global__"], total_cpus)
        memory.add_metric(["__global__"], total_memory)
        yield from (agents, failures, idle, target, cpus, memory)
