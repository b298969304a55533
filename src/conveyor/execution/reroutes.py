"""A job's reroutes as `run show` names them (docs/design/cluster.md §4.2, §4.4): one entry per ended offer to
a worker."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

# A claim for a worker carries this agent id prefix (`cluster.reroute.worker_agent_id`).
WORKER_AGENT_PREFIX = "worker:"

# Rows written before `dispatch_history.reason` existed: the outcome says what it can.
_REASON_OF_OUTCOME = {"ack_timeout": "ack-timeout"}


def reroute_entries(history: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The ended offers to workers among a job's `dispatch_history` rows, oldest first (pure).

    Each names the worker, the hop it was offered at, the outcome (`rejected`, `ack_timeout`,
    `taken_back`, `agent_lost`), the reason (a NAK reason, `ack-timeout`, `window`, `final`, `cap`,
    `session-gone`), the detail and when it ended. Rows of local agents are left out.
    """
    entries: list[dict[str, Any]] = []
    for row in sorted(history, key=lambda r: (r["ended_at"], r["id"])):
        agent_id = row.get("agent_id") or ""
        if not agent_id.startswith(WORKER_AGENT_PREFIX):
            continue
        entries.append(
            {
                "worker": agent_id[len(WORKER_AGENT_PREFIX) :],
                "hop": row.get("reroute_hop"),
                "attempt": row.get("attempt"),
                "outcome": row["outcome"],
                "reason": row.get("reason") or _REASON_OF_OUTCOME.get(row["outcome"]),
                "detail": row.get("detail"),
                "at": row["ended_at"],
            }
        )
    return entries
