"""Asking a peer on behalf of an admin request (drain, orphans): one set of HTTP answers for every route.

An unknown target is 404 `unknown_target`, a known one without a live session 503 `peer_not_connected`,
no answer in time 504 `peer_timeout`, and a refusal or an answer of another type 502 `peer_error`.
"""

from __future__ import annotations

from typing import Any, TypeVar

from conveyor.cluster.messages import PeerError
from conveyor.cluster.service import PeerHub, PeerUnavailable
from conveyor.model.errors import ApiError

Answer = TypeVar("Answer")


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
