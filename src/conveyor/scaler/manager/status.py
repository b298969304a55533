"""What `GET /api/v1/admin/scaler/status` shows of each scaler (docs/design/scaler.md §3): capacity, active and warm
agents, backoff state and last error. Pure: built from what the manager holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from conveyor.scaler.manager.core import AgentView, ScalerRuntime, Spawn


def scaler_status(
    scalers: Mapping[str, ScalerRuntime],
    spawns: Mapping[str, Spawn],
    connected: Mapping[str, AgentView],
    now: float,
) -> list[dict[str, Any]]:
    """Per scaler: capacity, active, warm, backoff state and last error, at wall-clock time `now`."""
    result: list[dict[str, Any]] = []
    for name, runtime in scalers.items():
        entry = runtime.entry
        # A spawn leaves `spawns` only once its teardown is over: one being torn down (SIGTERM
        # grace, slow exit) is still active, so `active == 0` means no agent process is left.
        mine = [s for s in spawns.values() if s.scaler == name]
        live = [s for s in mine if not s.ended]
        warm_idle = sum(
            1
            for s in live
            if s.warm
            and s.registered
            and not s.took_job
            and not getattr(connected.get(s.agent_id), "jobs", None)
        )
        in_backoff = runtime.next_attempt_at > now
        state = "retiring" if runtime.retiring else "failing" if runtime.failing else "active"
        result.append(
            {
                "name": name,
                "type": entry.type,
                "state": state,
                "max_agents": entry.max_agents,
                "active": len(mine),
                "spawning": sum(1 for s in live if not s.registered),
                "warm_idle": warm_idle,
                "warm_target": entry.warm_pool_size * len(entry.label_sets),
                "label_sets": [list(ls.all_labels) for ls in entry.label_sets],
                "mandatory_labels": list(entry.mandatory_labels),
                "runtime": getattr(runtime.backend, "runtime_name", None),
                "engine": getattr(runtime.backend, "engine_address", None),
                "backoff": {
                    "state": "backoff" if in_backoff else "ready",
                    "consecutive_failures": runtime.failures,
                    "next_attempt_at": (
                        datetime.fromtimestamp(runtime.next_attempt_at, UTC).isoformat()
                        if in_backoff
                        else None
                    ),
                    "last_error": runtime.last_error,
                },
                "cpus_used": sum(s.cpus for s in mine),
                "memory_bytes_used": sum(s.mem_bytes for s in mine),
            }
        )
    return result
