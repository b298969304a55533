"""The scaler backstop: the leader adopts the spawn records of coordinators that are gone and, after a
grace, tears down the instances they left stranded (docs/design/cluster.md §7.2, §1 leader-only tasks).

A coordinator's own reaper only ever reaches its own spawns. When a coordinator dies for good, its
`scaler_spawns` rows (and whatever compute they describe) would otherwise stay forever: the agent
token stays valid, the job stays bound to a spawn that will never register, and the instance keeps
running. The leader therefore *adopts* such rows (`adopted_by`, `adopted_at`), gives the node a long
chance to come back, and then ends them: it stops the instance if this host can see it, and closes
the record either way (history outcome `stranded`), which revokes the token and frees the job.

It acts only while its cluster view is sufficient — it knows no other coordinator, or at least one is
connected — so a leader cut off from every sibling does not destroy what they still run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.db.engine import Database
from conveyor.model.ids import utc_now
from conveyor.parts import PartKey
from conveyor.scaler import store
from conveyor.scaler.records import close_spawn_row

log = logging.getLogger(__name__)

STRANDED_OUTCOME = "stranded"


# --- the decision (pure)


@dataclass(frozen=True)
class SpawnRecord:
    """What the backstop reads of one `scaler_spawns` row."""

    agent_id: str
    node_id: str
    adopted_by: str | None = None
    adopted_at: datetime | None = None


@dataclass(frozen=True)
class BackstopView:
    """What the leader knows when it decides."""

    me: str
    now: datetime
    # The latest heartbeat of each coordinator (`cluster_instances`, or the peer registry if later).
    last_seen: Mapping[str, datetime]
    # Coordinators with a live peer session to this one.
    connected: frozenset[str]
    # Agent id → the coordinator it is registered with, for every online agent.
    online: Mapping[str, str | None]
    stale_window_ms: int
    flap_grace_ms: int
    stranded_timeout_ms: int
    view_sufficient: bool


@dataclass(frozen=True)
class BackstopPlan:
    """Rows to adopt, to give back (their node is live again), and to tear down now."""

    adopt: tuple[str, ...] = ()
    release: tuple[str, ...] = ()
    reap: tuple[str, ...] = ()


def backstop_grace_ms(*, flap_grace_ms: int, stale_window_ms: int) -> int:
    """The shortest wait after a node's last heartbeat before its instances may be destroyed.

    Its mistakes destroy compute, so it takes the longer of the reroute flap grace and two stale
    windows (docs/design/cluster.md §4.5): a node that is merely slow has been heard from well within that.
    """
    return max(flap_grace_ms, 2 * stale_window_ms)


def view_is_sufficient(*, coordinator_peers_known: int, coordinator_peers_connected: int) -> bool:
    """A backstop may reap only if it knows no other coordinator, or is connected to at least one."""
    return coordinator_peers_known == 0 or coordinator_peers_connected > 0


def node_is_live(node_id: str, view: BackstopView) -> bool:
    """Connected here, or heard from within the stale window."""
    if node_id in view.connected:
        return True
    seen = view.last_seen.get(node_id)
    return seen is not None and view.now - seen <= timedelta(milliseconds=view.stale_window_ms)


def reap_due_at(record: SpawnRecord, view: BackstopView) -> datetime | None:
    """When an adopted record may be torn down: `stranded_timeout_ms` after adoption, and never
    sooner than the backstop grace after the node's last heartbeat (or after adoption, when the node
    left no heartbeat to go by). None for a record this leader has not adopted."""
    if record.adopted_by != view.me or record.adopted_at is None:
        return None
    grace = timedelta(
        milliseconds=backstop_grace_ms(flap_grace_ms=view.flap_grace_ms, stale_window_ms=view.stale_window_ms)
    )
    last_seen = view.last_seen.get(record.node_id, record.adopted_at)
    return max(record.adopted_at + timedelta(milliseconds=view.stranded_timeout_ms), last_seen + grace)


def plan_backstop(records: Iterable[SpawnRecord], view: BackstopView) -> BackstopPlan:
    """What the leader does with each spawn record this pass (its own node's records are its reaper's)."""
    adopt: list[str] = []
    release: list[str] = []
    reap: list[str] = []
    for record in records:
        if record.node_id == view.me:
            continue
        if node_is_live(record.node_id, view):
            if record.adopted_by is not None:
                release.append(record.agent_id)
            continue
        if record.adopted_by != view.me:
            # Unadopted, or adopted by a former leader: this leader takes it over and starts the clock.
            adopt.append(record.agent_id)
            continue
        due = reap_due_at(record, view)
        if due is None or view.now < due or not view.view_sufficient:
            continue
        registered_with = view.online.get(record.agent_id)
        if registered_with is not None and node_is_live(registered_with, view):
            continue  # the agent works for a live coordinator: not stranded; it ends after its job
        reap.append(record.agent_id)
    return BackstopPlan(tuple(adopt), tuple(release), tuple(reap))


# --- the leader task (I/O)


FencedTransaction = Callable[[], AbstractAsyncContextManager[AsyncConnection]]


@dataclass(frozen=True)
class BackstopKnobs:
    """The live cluster settings one pass uses."""

    interval_ms: int
    flap_grace_ms: int
    stranded_timeout_ms: int


class ScalerBackstop:
    """Runs one backstop pass at a time for the leader; `manager` reaches this host's compute."""

    def __init__(
        self,
        db: Database,
        manager: Any,
        *,
        me: str,
        stale_window_ms: int,
        knobs: Callable[[], Awaitable[BackstopKnobs]],
        peers: Callable[[], tuple[dict[str, datetime], frozenset[str], int]],
        stops_compute: Callable[[], bool] = lambda: True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.db = db
        self.manager = manager
        self.me = me
        self.stale_window_ms = stale_window_ms
        self.knobs = knobs
        # (last heard per coordinator peer, connected coordinator peers, coordinator peers known)
        self.peers = peers
        # Only a node that runs scalers stops compute (the peer-forget guard counts on it); any leader
        # closes the records, which revokes their tokens and frees their jobs.
        self.stops_compute = stops_compute
        self.clock = clock
        self._last_pass: float | None = None

    async def tick(self, fenced: FencedTransaction) -> BackstopPlan | None:
        """A pass if `scaler_reap_interval_ms` has elapsed since the last one (read live)."""
        knobs = await self.knobs()
        now = self.clock()
        if self._last_pass is not None and (now - self._last_pass) * 1000 < knobs.interval_ms:
            return None
        self._last_pass = now
        return await self.run_once(fenced, knobs)

    async def view(self, knobs: BackstopKnobs, now: datetime) -> tuple[list[SpawnRecord], BackstopView]:
        async with self.db.read() as conn:
            rows = await store.adoption_states(conn)
            coordinators = await store.coordinators(conn)
            online = await store.online_agents(conn)
        heard, connected, known = self.peers()
        last_seen: dict[str, datetime] = dict(coordinators)
        for instance_id, at in heard.items():
            last_seen[instance_id] = max(at, last_seen.get(instance_id, at))
        view = BackstopView(
            me=self.me,
            now=now,
            last_seen=last_seen,
            connected=connected,
            online=online,
            stale_window_ms=self.stale_window_ms,
            flap_grace_ms=knobs.flap_grace_ms,
            stranded_timeout_ms=knobs.stranded_timeout_ms,
            view_sufficient=view_is_sufficient(
                coordinator_peers_known=known, coordinator_peers_connected=len(connected)
            ),
        )
        return [SpawnRecord(*row) for row in rows], view

    async def run_once(self, fenced: FencedTransaction, knobs: BackstopKnobs) -> BackstopPlan:
        """Adopt, give back and tear down as `plan_backstop` says; leader writes are fenced."""
        now = utc_now()
        records, view = await self.view(knobs, now)
        by_id = {record.agent_id: record for record in records}
        plan = plan_backstop(records, view)
        if plan.adopt or plan.release:
            async with fenced() as conn:
                await store.set_adoption(conn, plan.adopt, self.me, now)
                await store.set_adoption(conn, plan.release, None, None)
            for agent_id in plan.adopt:
                log.warning(
                    "adopted the spawn record of agent %s: its node %s is not live",
                    agent_id,
                    by_id[agent_id].node_id,
                    extra={"agent_id": agent_id},
                )
        if plan.reap:
            # One listing of this host's compute for the whole pass (a container or VM scan each).
            live = await self.manager.live_items() if self.stops_compute() else []
            for agent_id in plan.reap:
                await self._tear_down(by_id[agent_id], live, fenced)
        return plan

    async def _tear_down(self, record: SpawnRecord, live: list[Any], fenced: FencedTransaction) -> None:
        """Stop the instance if this host sees it, then close the record (`stranded`)."""
        stopped = False
        for backend, item in live:
            if item.agent_id != record.agent_id:
                continue
            try:
                await self.manager.stop_item(backend, item)
                stopped = True
            except Exception:
                log.exception("the backstop could not stop %s %s", item.kind, item.vm_id)
                return  # the record stays adopted; the next pass tries again
        detail = (
            f"stranded: node {record.node_id} is gone; stopped by the backstop on {self.me}"
            if stopped
            else f"stranded: node {record.node_id} is gone; no live instance on {self.me}'s host "
            "(see `conveyor admin scaler orphans list`)"
        )
        async with fenced() as conn:
            row = await store.get_spawn(conn, record.agent_id)
            if row is None or row["adopted_by"] != self.me:
                return  # ended or taken over since the read
            await close_spawn_row(conn, row, outcome=STRANDED_OUTCOME, now=utc_now(), error=detail)
        log.warning(
            "the backstop ended the stranded spawn of agent %s (node %s): %s",
            record.agent_id,
            record.node_id,
            "instance stopped" if stopped else "no instance seen here",
            extra={"agent_id": record.agent_id},
        )


CoordinatorPeers = Callable[[], tuple[dict[str, datetime], frozenset[str], int]]
"""This coordinator's view of the others: last heard per coordinator peer, those connected now, how many are
known (the cluster hook publishes it; a node without one knows no peer)."""
COORDINATOR_PEERS = PartKey[CoordinatorPeers]("coordinator_peers")
