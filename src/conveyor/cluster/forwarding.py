"""Asking a peer on behalf of an admin request (drain, orphans, scaler reload, support bundles): one set of
HTTP answers for every route, one set of per-node outcomes for a fan-out, and one reading of a `target`.

An unknown target is 404 `unknown_target`, a known one without a live session 503 `peer_not_connected`,
no answer in time 504 `peer_timeout`, and a refusal or an answer of another type 502 `peer_error`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from conveyor.cluster.messages import PeerError
from conveyor.cluster.service import PeerHub, PeerUnavailable
from conveyor.db.engine import Database
from conveyor.model.errors import ApiError
from conveyor.runtime import store as runtime_store
from conveyor.scaler.reload_results import ALL_NODES

Answer = TypeVar("Answer")


@dataclass(frozen=True)
class NoAnswer:
    """Why a node a fan-out asked gave no usable answer: `unreachable` (no session, gone, too slow) or
    `refused` (a `peer.error`, or an answer of another type)."""

    outcome: Literal["unreachable", "refused"]
    detail: str


async def target_nodes(hub: PeerHub, db: Database, target: str) -> list[tuple[str, str]]:
    """(instance id, role) of the other nodes `target` names: for `all`, every peer the registry knows
    (connected or not); else that peer, found in the registry or among the `cluster_instances` rows.
    404 `unknown_target` for a name nobody knows. This node itself is never in the list."""
    me = hub.identity.instance_id
    if target == ALL_NODES:
        return sorted((e.instance_id, e.role) for e in hub.registry.entries() if e.instance_id != me)
    if target == me:
        return []
    entry = hub.registry.get(target)
    if entry is not None:
        return [(target, entry.role)]
    async with db.read() as conn:
        row = await runtime_store.read_instance(conn, target)
    if row is None:
        raise ApiError(404, "unknown_target", f"no instance {target} is known to the cluster")
    return [(target, row.role)]


def require_connected(hub: PeerHub, target: str, *, known: bool) -> None:
    """404 when nobody knows `target`, 503 when it has no live session with this node."""
    if target in hub.sessions:
        return
    if not known:
        raise ApiError(404, "unknown_target", f"no instance {target} is known to the cluster")
    raise ApiError(503, "peer_not_connected", f"instance {target} is not connected to this node")


async def ask_peer(
    hub: PeerHub, target: str, request: Any, timeout_s: float, answer_type: type[Answer]
) -> Answer:
    """Send `request` to `target` and return its answer of `answer_type`, or raise the route's ApiError."""
    try:
        answer = await hub.request(target, request, timeout_s)
    except PeerUnavailable:
        raise ApiError(503, "peer_not_connected", f"{target} disconnected before answering") from None
    except TimeoutError:
        raise ApiError(504, "peer_timeout", f"{target} did not answer within {timeout_s:g} s") from None
    if isinstance(answer, PeerError):
        raise ApiError(502, "peer_error", f"{target} answered {answer.error}: {answer.detail}")
    if not isinstance(answer, answer_type):
        raise ApiError(502, "peer_error", f"{target} answered {getattr(answer, 'type', '?')}")
    return answer


async def ask_in_fan_out(
    hub: PeerHub, node: str, request: Any, timeout_s: float, answer_type: type[Answer]
) -> Answer | NoAnswer:
    """`ask_peer` for a fan-out over several nodes (`scaler reload --target all`, a support bundle): a node
    that cannot answer becomes its `NoAnswer` outcome instead of failing the whole request."""
    if node not in hub.sessions:
        return NoAnswer("unreachable", f"not connected to {hub.identity.instance_id}")
    try:
        answer = await hub.request(node, request, timeout_s)
    except PeerUnavailable:
        return NoAnswer("unreachable", "disconnected before answering")
    except TimeoutError:
        return NoAnswer("unreachable", f"no answer within {timeout_s:g} s")
    if isinstance(answer, PeerError):
        return NoAnswer("refused", f"{answer.error}: {answer.detail}")
    if not isinstance(answer, answer_type):
        return NoAnswer("refused", f"answered {getattr(answer, 'type', '?')}")
    return answer
