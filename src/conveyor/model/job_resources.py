"""The labels on every container and network a container job starts (docs/design/containers.md §5).

Shared by the agent's runner, which puts them on, and the scaler, which removes what an agent it ended left:
the scaler may not import the agent program (docs/design/ARCHITECTURE.md §3).
"""

from __future__ import annotations

RESOURCE_LABEL = "conveyor.job-resource"
JOB_LABEL = "conveyor.job"
AGENT_LABEL = "conveyor.agent"
ROLE_LABEL = "conveyor.role"
SERVICE_LABEL = "conveyor.service"


def agent_resource_filter(agent_id: str) -> list[str]:
    """The `label` filter values selecting the job resources of `agent_id`'s jobs."""
    return [f"{RESOURCE_LABEL}=true", f"{AGENT_LABEL}={agent_id}"]
