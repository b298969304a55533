"""Scaler reload on other nodes (docs/design/scaler.md §3.1): a coordinator forwards `scaler reload --target`.

Each node reloads its own files with its own manager; the coordinator asks every node the target names
over the peer channel (`peer.scaler.reload.request`), in parallel, and turns what cannot answer into
`unreachable`. A target is read by `forwarding.target_nodes`: the registry, then the rows of `cluster_instances`. A node answers only a peer whose credential role is `coordinator`.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from conveyor.cluster.forwarding import NoAnswer, ask_in_fan_out, target_nodes
from conveyor.cluster.messages import ScalerReloadRequest, ScalerReloadResponse
from conveyor.cluster.orphans import COORDINATORS_ONLY
from conveyor.cluster.peer import PeerSession
from conveyor.cluster.service import PeerHub
from conveyor.db.engine import Database
from conveyor.scaler.reload_results import Reloadable, node_result, reload_here

log = logging.getLogger(__name__)


@dataclass
class ScalerReloadForwarder:
    """A coordinator's side of `scaler reload --target` (`scaler.routes.ReloadForwarder`)."""

    hub: PeerHub
    db: Database

    async def nodes(self, target: str) -> list[tuple[str, str]]:
        """The other nodes `target` names (`forwarding.target_nodes`): for `all` every known peer,
        connected or not (those that are not answer `unreachable`)."""
        return await target_nodes(self.hub, self.db, target)

    async def reload(self, node: str, role: str, timeout_ms: int) -> dict[str, object]:
        """Ask one node to reload; what does not answer in time is `unreachable`, with the reason."""
        request = ScalerReloadRequest(message_id=uuid.uuid4().hex)
        answer = await ask_in_fan_out(self.hub, node, request, timeout_ms / 1000, ScalerReloadResponse)
        if isinstance(answer, NoAnswer):
            return node_result(node, role, answer.outcome, answer.detail)
        return node_result(node, role, answer.outcome, answer.detail, answer.scalers)


def install_reload_answers(hub: PeerHub, manager_of: Callable[[], Reloadable | None]) -> None:
    """Answer coordinators' `peer.scaler.reload.request` by reloading this node's scaler configuration."""

    async def answer(session: PeerSession, message: ScalerReloadRequest) -> ScalerReloadResponse:
        me, role = hub.identity.instance_id, hub.identity.role
        if session.peer_role != "coordinator":
            log.warning("refused a scaler reload request from %s (%s)", session.peer_id, session.peer_role)
            return ScalerReloadResponse(
                message_id=message.message_id, node=me, outcome="refused", detail=COORDINATORS_ONLY
            )
        manager = manager_of()
        if manager is None:
            return ScalerReloadResponse(
                message_id=message.message_id,
                node=me,
                outcome="refused",
                detail="the scaler has not started on this node",
            )
        result = await reload_here(manager, me, role)
        log.info("scaler reload asked by %s: %s (%s)", session.peer_id, result["outcome"], result["detail"])
        return ScalerReloadResponse(
            message_id=message.message_id,
            node=me,
            outcome=result["outcome"],
            detail=result["detail"],
            scalers=result.get("scalers"),
        )

    hub.handle("peer.scaler.reload.request", answer)
