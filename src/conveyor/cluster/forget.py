"""Peer forget (docs/design/cluster.md §7): the decisions, with no I/O.

A departed peer keeps counting in `/cluster/health`, the propagation report and the scaler backstop's
cluster view until an operator forgets it. Forgetting a peer that is only briefly away would let the
backstop tear down instances a live node still uses, so each coordinator checks the same guards
against its own view before it drops the entry.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal

from conveyor.cluster.messages import ForgetRequest, ForgetResponse
from conveyor.cluster.peer import PeerSession
from conveyor.cluster.service import PeerHub, PeerUnavailable
from conveyor.db.engine import Database
from conveyor.runtime import store as runtime_store

log = logging.getLogger(__name__)

ForgetOutcome = Literal[
    "forgotten",
    "not-known",
    "self",
    "connected",
    "within-liveness-window",
    "backstop-acknowledgement-required",
    "error",
    "timeout",
    "not-connected",
]
WindowKind = Literal["stale-window", "reroute-grace", "adopter-grace"]

# Outcomes of the local check that stop the fan-out to sibling coordinators (docs/design/cluster.md §7.1
# step 1).
LOCAL_REFUSALS: frozenset[str] = frozenset(
    {"self", "connected", "within-liveness-window", "backstop-acknowledgement-required", "error"}
)
# Outcomes after which the CLI exits 0: the peer is gone everywhere that answered.
SETTLED: frozenset[str] = frozenset({"forgotten", "not-known"})


@dataclass(frozen=True)
class LivenessWindow:
    """How long after its last heartbeat a peer may not be forgotten, and which rule set it."""

    kind: WindowKind
    ms: int


def peer_liveness_window(
    *, stale_window_ms: int, flap_grace_ms: int, adopted_provisions: bool
) -> LivenessWindow:
    """The window of docs/design/cluster.md §7.2: a peer that adopted scaler provisions gets the backstop's
    grace.

    The backstop destroys instances, so its grace is the longer of the flap grace and two stale
    windows; any other peer needs only to be past both the stale window and the reroute flap grace
    (an outbox replay may still arrive within the latter).
    """
    if adopted_provisions:
        return LivenessWindow("adopter-grace", max(flap_grace_ms, 2 * stale_window_ms))
    if stale_window_ms >= flap_grace_ms:
        return LivenessWindow("stale-window", stale_window_ms)
    return LivenessWindow("reroute-grace", flap_grace_ms)


@dataclass(frozen=True)
class ForgetFacts:
    """What one coordinator knows about the target when asked to forget it."""

    target: str
    me: str
    known: bool
    connected: bool
    target_role: str | None
    # It said `peer.leaving` (a clean shutdown) and has not connected since: no liveness window applies.
    left: bool
    # Milliseconds since the later of the registry's and `cluster_instances`' last heartbeat; None if
    # neither ever recorded one (a seeded entry whose row is gone: nothing says it is alive).
    heard_age_ms: int | None
    window: LivenessWindow
    runs_backstop: bool
    # Coordinator peers this node knows, and how many are connected, the target included.
    coordinator_peers_known: int
    coordinator_peers_connected: int
    acknowledged: bool


@dataclass(frozen=True)
class ForgetDecision:
    """The local answer: an outcome and a detail for the operator."""

    outcome: ForgetOutcome
    detail: str = ""


def forget_departed_peer(facts: ForgetFacts) -> ForgetDecision:
    """Whether this coordinator may drop `facts.target` (docs/design/cluster.md §7.1–§7.2), and why not if it
    may not."""
    if facts.target == facts.me:
        return ForgetDecision("self", "this is the answering coordinator")
    if not facts.known:
        return ForgetDecision("not-known", "no entry for this peer here")
    if facts.connected:
        return ForgetDecision("connected", "the peer has a live session here; revoke it first if it must go")
    if not facts.left and facts.heard_age_ms is not None and facts.heard_age_ms < facts.window.ms:
        left = facts.window.ms - facts.heard_age_ms
        return ForgetDecision(
            "within-liveness-window",
            f"{facts.window.kind}: heard from {facts.heard_age_ms} ms ago; {left} ms left of {facts.window.ms} ms",
        )
    if facts.runs_backstop and not facts.acknowledged and facts.target_role == "coordinator":
        known_after = facts.coordinator_peers_known - 1
        connected_after = facts.coordinator_peers_connected  # the target is not connected (checked above)
        if known_after <= 0 and connected_after <= 0:
            return ForgetDecision(
                "backstop-acknowledgement-required",
                "this coordinator would know no other coordinator, which switches its scaler backstop on: "
                "it may then tear down the departed peer's instances; acknowledge to go on",
            )
    return ForgetDecision("forgotten", "")


def forget_status_code(outcomes: list[str]) -> int:
    """409 when any coordinator wants the backstop acknowledged, else 200."""
    return 409 if "backstop-acknowledgement-required" in outcomes else 200


# --- the service: gathers the facts, applies a local `forgotten`, fans out to sibling coordinators


@dataclass(frozen=True)
class ForgetResult:
    """One coordinator's answer (the first is always the local one)."""

    coordinator: str
    outcome: str
    detail: str = ""


@dataclass
class PeerForgetter:
    """Answers `POST peers/forget` and sibling coordinators' `peer.forget.request`
    (docs/design/cluster.md §7)."""

    hub: PeerHub
    db: Database
    # The effective `reroute_flap_grace_ms` (cluster settings: read at each forget, no restart needed).
    flap_grace_ms: Callable[[], Awaitable[int]]
    # Whether this coordinator runs a scaler backstop (it has scalers): then it must not be left with
    # no coordinator peer by surprise.
    runs_backstop: Callable[[], bool]
    # Whether the peer adopted scaler provisions (`scaler_spawns.adopted_by` rows, the scaler backstop).
    adopted_provisions: Callable[[str], Awaitable[bool]] = field(default=lambda instance_id: _never())

    def install(self) -> None:
        """Answer siblings' forget requests on the hub."""
        self.hub.handle("peer.forget.request", self._on_request)

    async def forget(self, instance_id: str, *, acknowledged: bool, timeout_ms: int) -> list[ForgetResult]:
        """Forget here, then (unless refused here) on every connected sibling coordinator in parallel."""
        me = self.hub.identity.instance_id
        local = await self.forget_here(instance_id, acknowledged=acknowledged)
        results = [ForgetResult(me, local.outcome, local.detail)]
        if local.outcome in LOCAL_REFUSALS:
            return results
        siblings = [
            e.instance_id
            for e in self.hub.registry.entries()
            if e.role == "coordinator" and e.instance_id not in (me, instance_id)
        ]
        connected = set(self.hub.connected("coordinator"))
        answers = await asyncio.gather(
            *(
                self._ask(sibling, instance_id, acknowledged, timeout_ms)
                for sibling in siblings
                if sibling in connected
            )
        )
        by_sibling = {answer.coordinator: answer for answer in answers}
        for sibling in siblings:
            results.append(
                by_sibling.get(sibling)
                or ForgetResult(sibling, "not-connected", "no link to this coordinator: nothing sent")
            )
        return results

    async def forget_here(self, instance_id: str, *, acknowledged: bool) -> ForgetDecision:
        """Check the guards against this node's view; drop the entry and its row when they allow it."""
        try:
            facts, heard_before = await self._facts(instance_id, acknowledged)
        except Exception as exc:
            log.warning("forget %s: could not read the guards: %s", instance_id, exc)
            return ForgetDecision("error", f"could not read the guards: {exc}")
        decision = forget_departed_peer(facts)
        if decision.outcome != "forgotten":
            return decision
        try:
            async with self.db.transaction() as conn:
                # Conditional: a peer that beat again meanwhile keeps its row (and will be known again).
                await runtime_store.forget_instance(conn, instance_id, heard_before)
        except Exception as exc:
            log.warning("forget %s: its row stays, and so does its entry: %s", instance_id, exc)
            return ForgetDecision("error", f"could not delete its cluster_instances row: {exc}")
        # The row goes first: sibling discovery reading rows after this sees none to seed it from.
        self.hub.registry.forget(instance_id)
        log.info("forgot peer %s", instance_id)
        return decision

    async def _facts(self, instance_id: str, acknowledged: bool) -> tuple[ForgetFacts, datetime]:
        hub = self.hub
        entry = hub.registry.get(instance_id)
        async with self.db.read() as conn:
            row = await runtime_store.read_instance(conn, instance_id)
            db_now = await runtime_store.database_now(conn)
        ages = []
        if entry is not None and (age := entry.heartbeat_age_ms(hub.clock())) is not None:
            ages.append(age)
        if row is not None:
            ages.append(max(0, int((db_now - row.last_heartbeat_at).total_seconds() * 1000)))
        window = peer_liveness_window(
            stale_window_ms=hub.settings.heartbeat_interval_ms * hub.settings.stale_beats,
            flap_grace_ms=await self.flap_grace_ms(),
            adopted_provisions=await self.adopted_provisions(instance_id),
        )
        me = hub.identity.instance_id
        coordinators = [e for e in hub.registry.entries() if e.role == "coordinator" and e.instance_id != me]
        left = entry is not None and entry.left and entry.left_monotonic is not None
        facts = ForgetFacts(
            target=instance_id,
            me=me,
            known=entry is not None or row is not None,
            connected=instance_id in hub.sessions,
            target_role=entry.role if entry is not None else (row.role if row is not None else None),
            left=left,
            heard_age_ms=min(ages) if ages else None,
            window=window,
            runs_backstop=self.runs_backstop(),
            coordinator_peers_known=len(coordinators),
            coordinator_peers_connected=sum(1 for e in coordinators if e.instance_id in hub.sessions),
            acknowledged=acknowledged,
        )
        if left:
            assert entry is not None and entry.left_monotonic is not None
            # Its row goes unless it beat after it left (it came back and is starting again).
            since_left = max(0.0, hub.clock() - entry.left_monotonic)
            return facts, db_now - timedelta(seconds=since_left)
        return facts, db_now - timedelta(milliseconds=window.ms)

    async def _ask(self, sibling: str, instance_id: str, acknowledged: bool, timeout_ms: int) -> ForgetResult:
        request = ForgetRequest(
            message_id=uuid.uuid4().hex, instance_id=instance_id, acknowledge_backstop=acknowledged
        )
        try:
            reply = await self.hub.request(sibling, request, timeout_ms / 1000)
        except TimeoutError:
            return ForgetResult(sibling, "timeout", f"no answer within {timeout_ms} ms")
        except PeerUnavailable:
            return ForgetResult(sibling, "not-connected", "the link closed before the answer")
        if isinstance(reply, ForgetResponse):
            return ForgetResult(sibling, reply.outcome, reply.detail)
        detail = getattr(reply, "detail", "") or f"answered {getattr(reply, 'type', '?')}"
        return ForgetResult(sibling, "error", detail)

    async def _on_request(self, session: PeerSession, message: ForgetRequest) -> ForgetResponse:
        # The role is the credential row's (acceptor) or `coordinator` (we dialed it): never self-declared.
        if session.peer_role != "coordinator":
            log.warning("refused a forget request from %s (%s)", session.peer_id, session.peer_role)
            return ForgetResponse(
                message_id=message.message_id,
                outcome="error",
                detail="only coordinators may send forget requests",
            )
        decision = await self.forget_here(message.instance_id, acknowledged=message.acknowledge_backstop)
        return ForgetResponse(message_id=message.message_id, outcome=decision.outcome, detail=decision.detail)


async def _never() -> bool:
    return False
