"""Agents as the orchestrator sees them: tokens, the `agents` table, their admin routes
(docs/design/execution.md §6)."""

from conveyor.agents.store import authenticate_agent_token, bind_agent_id, mint_agent_token
from conveyor.agents.tokens import (
    AgentAuthRefusal,
    AgentTokenRow,
    check_registration_labels,
    normalise_labels,
)

__all__ = [
    "AgentAuthRefusal",
    "AgentTokenRow",
    "authenticate_agent_token",
    "bind_agent_id",
    "check_registration_labels",
    "mint_agent_token",
    "normalise_labels",
]
