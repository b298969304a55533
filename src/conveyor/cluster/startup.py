"""Start-up hooks of the peer hub: coordinators (after the runtime core) and workers (no database)."""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Protocol

from conveyor.agents.hub import AGENT_HUB, AgentHub
from conveyor.agents.hub import HubSettings as AgentHubSettings
from conveyor.agents.routes import KICKER
from conveyor.cluster import store
from conveyor.cluster.auth import AuthThrottle, PeerAuthenticator, self_enrol
from conveyor.cluster.drain import (
    DRAIN,
    WORKER_SHUTDOWN,
    NodeDrain,
    NoJobs,
    WorkerShutdown,
    drain_request_handler,
)
from conveyor.cluster.forget import PeerForgetter
from conveyor.cluster.inventory import agent_inventory, scaler_inventory
from conveyor.cluster.messages import (
    AgentInventory,
    AgentTokenRevoke,
    Heartbeat,
    JobRerouteAck,
    LeaseInfo,
    PeerMessage,
    ScalerInventory,
)
from conveyor.cluster.orphans import OrphanForwarder, install_orphan_answers, worker_facts
from conveyor.cluster.outbox import Outbox, OutboxMetrics
from conveyor.cluster.peer import PeerSession, SocketClosed
from conveyor.cluster.registry import PeerRegistry
from conveyor.cluster.reroute import (
    RerouteMetrics,
    RerouteService,
    RerouteSettings,
    WorkerView,
    resolve_reroute_settings,
    within_flap_grace,
)
from conveyor.cluster.routes import FORGETTER, PEER_HUB
from conveyor.cluster.scaler_reload import ScalerReloadForwarder, install_reload_answers
from conveyor.cluster.service import HubIdentity, HubSettings, PeerHub
from conveyor.cluster.snapshot import (
    SETTINGS_SNAPSHOT,
    SettingsPuller,
    WorkerSettingsSnapshot,
    settings_request_handler,
    snapshot_defaults,
)
from conveyor.cluster.transfer_proxy import TRANSFER_PROXY, ProxyMetrics, TransferProxy
from conveyor.cluster.worker import (
    RESEND_AFTER_S,
    WorkerService,
    worker_inventory,
    worker_knob,
)
from conveyor.db.engine import Database
from conveyor.execution.dispatcher import DISPATCHER
from conveyor.execution.sweeps import SWEEP_SETTINGS
from conveyor.model.knobs import CLUSTER_KNOBS_BY_NAME
from conveyor.parts import PartKey, Parts
from conveyor.runtime.instances import default_advertise_url, load_instance_id
from conveyor.runtime.lease import LeaderContext, LeaderTask
from conveyor.runtime.loops import WakeableLoop
from conveyor.runtime.node import Component, NodeMetrics, set_instance_id
from conveyor.runtime.reports import PEER_VERSIONS, PeerVersion
from conveyor.runtime.settings import ClusterSettingsView
from conveyor.scaler import store as scaler_store
from conveyor.scaler.backstop import COORDINATOR_PEERS
from conveyor.scaler.config import SharedConfig
from conveyor.scaler.manager import ScalerManager
from conveyor.scaler.orphans import Facts, Orphans
from conveyor.scaler.routes import ORPHAN_FORWARDER, ORPHANS, RELOAD_FORWARDER, SCALER
from conveyor.scaler.startup import ScalerNode, ScalerSettings
from conveyor.scaler.store import has_adopted
from conveyor.secrets.service import SECRETS
from conveyor.version import VERSION

if TYPE_CHECKING:
    from prometheus_client import Counter, Gauge

log = logging.getLogger(__name__)

REROUTE = PartKey[RerouteService]("reroute")
WORKER = PartKey[WorkerService]("worker")

PRUNE_INTERVAL_MS = 3600 * 1000
JOIN_TOKEN_KEEP_EXPIRED = timedelta(days=1)

# Test hooks (inert unless set): how often the revocation backstop re-checks live sessions, and how long
# a peer has to authenticate (60 s and 15 s are too long to wait for in a test).
TEST_REVOCATION_CHECK_ENV = "CONVEYOR_TEST_PEER_REVOCATION_CHECK_MS"
TEST_AUTH_TIMEOUT_ENV = "CONVEYOR_TEST_PEER_AUTH_TIMEOUT_MS"


class ClusterSettings(ScalerSettings, Protocol):
    """What the cluster hooks read of the node's configuration (a worker's scaler's settings too)."""

    cluster_advertise_url: str | None
    cluster_coordinator_urls: str | None
    cluster_join_token: str | None
    cluster_heartbeat_interval_ms: int
    cluster_peer_stale_beats: int
    worker_drain_timeout_ms: int
    ws_max_message_bytes: int
    agent_dead_after_ms: int
    recovery_grace_ms: int
    dispatch_max_attempts: int
    dispatch_poll_ms: int


class ClusterMetrics(NodeMetrics, Protocol):
    """The node's collectors the peer hub updates."""

    peer_connected: Gauge
    peer_auth_failures: Counter


class ClusterNode(ScalerNode, Protocol):
    """The node as the cluster hooks see it."""

    @property
    def settings(self) -> ClusterSettings: ...

    @property
    def metrics(self) -> ClusterMetrics: ...


def _settings(state: ClusterNode) -> HubSettings:
    settings = state.settings
    hub = HubSettings(
        heartbeat_interval_ms=settings.cluster_heartbeat_interval_ms,
        stale_beats=settings.cluster_peer_stale_beats,
        ws_max_message_bytes=settings.ws_max_message_bytes,
    )
    if check := os.environ.get(TEST_REVOCATION_CHECK_ENV):
        hub.revocation_check_ms = int(check)
    if timeout := os.environ.get(TEST_AUTH_TIMEOUT_ENV):
        hub.auth_timeout_s = int(timeout) / 1000
    return hub


def _registry(state: ClusterNode) -> PeerRegistry:
    gauge = state.metrics.peer_connected

    def changed(instance_id: str, role: str, connected: bool) -> None:
        gauge.labels(instance_id, role).set(1 if connected else 0)

    return PeerRegistry(on_change=changed)


class AgentHubJobs(NoJobs):
    """A coordinator's running jobs for drain status: those its connected agents run."""

    def __init__(self, parts: Parts) -> None:
        self._parts = parts

    def running_jobs_count(self) -> int:
        """Jobs the agents connected to this coordinator run (the agent hub starts after this hook)."""
        agent_hub = self._parts.get(AGENT_HUB)
        if agent_hub is None:
            return 0
        return sum(len(c.jobs) for c in agent_hub.connections.values() if not c.closed)


def peer_versions(hub: PeerHub) -> list[PeerVersion]:
    """Every registry peer's last advertised settings version, for the propagation report."""
    now = hub.clock()
    return [
        PeerVersion(
            instance_id=entry.instance_id,
            role=entry.role,
            connected=entry.connected,
            applied_version=entry.applied_settings_version,
            last_heartbeat_at=entry.last_heartbeat_at,
            last_heartbeat_age_ms=entry.heartbeat_age_ms(now) if entry.last_heartbeat_at else None,
        )
        for entry in hub.registry.entries()
    ]


def coordinator_peers(hub: PeerHub, me: str) -> tuple[dict[str, datetime], frozenset[str], int]:
    """The scaler backstop's view of the other coordinators: last heard per peer, those connected now, and how
    many the registry knows."""
    coordinators = [e for e in hub.registry.entries() if e.role == "coordinator" and e.instance_id != me]
    heard = {e.instance_id: e.last_heartbeat_at for e in coordinators if e.last_heartbeat_at is not None}
    connected = frozenset(hub.connected("coordinator")) - {me}
    return heard, connected, len(coordinators)


async def start(state: ClusterNode) -> Sequence[Component]:
    """Coordinator hook: self-enrol, accept `/ws/peer`, dial higher-id live sibling coordinators."""
    from conveyor.runtime.boot import runtime_services

    if state.settings.cluster_role != "coordinator":
        return []
    runtime = runtime_services(state.parts)
    identity = runtime.identity
    await self_enrol(state.db, state.settings.home, identity.instance_id)
    failures = state.metrics.peer_auth_failures

    def lease_info() -> LeaseInfo:
        leadership = runtime.leadership
        return LeaseInfo(
            holder=identity.instance_id if leadership.is_leader else None, epoch=leadership.epoch
        )

    def secret_key_fingerprint() -> str | None:
        # The secrets hook starts after this one: looked up at each beat, not at start-up.
        secrets = state.parts.get(SECRETS)
        return secrets.keyring.current.fingerprint if secrets is not None else None

    async def settings_version() -> int:
        return (await runtime.settings.cluster()).version

    def inventory() -> tuple[list[AgentInventory], list[ScalerInventory]]:
        # The agent and scaler hooks start after this one: looked up at each beat.
        agent_hub = state.parts.get(AGENT_HUB)
        scaler = state.parts.get(SCALER)
        agents = agent_inventory(agent_hub.connections.values()) if agent_hub is not None else []
        return agents, scaler_inventory(scaler.status()) if scaler is not None else []

    hub = PeerHub(
        identity=HubIdentity(identity.instance_id, "coordinator", VERSION, identity.advertise_url),
        settings=_settings(state),
        home=state.settings.home,
        registry=_registry(state),
        db=state.db,
        authenticator=PeerAuthenticator(
            state.db,
            me=identity.instance_id,
            throttle=AuthThrottle(),
            on_failure=lambda reason: failures.labels(reason).inc(),
        ),
        settings_version=settings_version,
        lease_info=lease_info,
        is_leader=lambda: runtime.leadership.is_leader,
        secret_key_fingerprint=secret_key_fingerprint,
        inventory=inventory,
    )
    drain = NodeDrain(jobs=AgentHubJobs(state.parts))
    hub.draining = lambda: drain.draining
    runtime.heartbeat.draining = lambda: drain.draining
    _serve_settings_snapshots(hub, runtime.settings.read_cluster_uncached, state.db)
    hub.handle("peer.drain.request", drain_request_handler(drain))
    state.parts.put(DRAIN, drain)
    state.parts.put(PEER_VERSIONS, lambda: peer_versions(hub))
    state.parts.put(COORDINATOR_PEERS, lambda: coordinator_peers(hub, identity.instance_id))
    await hub.start()
    state.parts.put(PEER_HUB, hub)

    async def offer_rotations(_context: LeaderContext) -> None:
        await hub.offer_rotations()

    # A leader task runs at once when this node acquires the lease, then at each interval.
    runtime.leadership.register(
        LeaderTask("peer-credential-rotation", hub.settings.revocation_check_ms, offer_rotations)
    )

    async def flap_grace_ms() -> int:
        return int(await runtime.settings.cluster_value("reroute_flap_grace_ms") or 0)

    def runs_backstop() -> bool:
        # Looked up at each forget: the scaler hook starts after this one.
        scaler = state.parts.get(SCALER)
        return scaler is not None and bool(scaler.status())

    async def adopted_provisions(instance_id: str) -> bool:
        async with state.db.read() as conn:
            return await has_adopted(conn, instance_id)

    forgetter = PeerForgetter(
        hub,
        state.db,
        flap_grace_ms=flap_grace_ms,
        runs_backstop=runs_backstop,
        adopted_provisions=adopted_provisions,
    )
    forgetter.install()
    state.parts.put(FORGETTER, forgetter)
    state.parts.put(
        ORPHAN_FORWARDER, OrphanForwarder(hub, state.db, timedelta(milliseconds=runtime.stale_window_ms))
    )
    # The scaler hook starts after this one: its `Orphans` is looked up at each request.
    install_orphan_answers(hub, lambda: state.parts.get(ORPHANS))
    # `scaler reload --target` (docs/design/scaler.md §3.1): asked of others, answered for coordinators.
    state.parts.put(RELOAD_FORWARDER, ScalerReloadForwarder(hub, state.db))
    install_reload_answers(hub, lambda: state.parts.get(SCALER))
    runtime.leadership.register(LeaderTask("prune-join-tokens", PRUNE_INTERVAL_MS, _prune_join_tokens))
    return [hub]


async def start_reroute(state: ClusterNode) -> Sequence[Component]:
    """Coordinator hook (after the dispatcher and the event router): offer jobs to connected workers."""
    from conveyor.runtime.boot import runtime_services

    hub = state.parts.get(PEER_HUB)
    dispatcher = state.parts.get(DISPATCHER)
    agent_hub = state.parts.get(AGENT_HUB)
    if state.settings.cluster_role != "coordinator" or hub is None or dispatcher is None:
        return []
    runtime = runtime_services(state.parts)

    async def settings(org_id: str) -> RerouteSettings:
        return await resolve_reroute_settings(org_id, runtime.settings.org_value)

    async def ownership_check_timeout_ms() -> int:
        value = await runtime.settings.cluster_value("ownership_db_check_timeout_ms")
        return int(
            value
            if value is not None
            else state.settings.knob_default(CLUSTER_KNOBS_BY_NAME["ownership_db_check_timeout_ms"]) or 0
        )

    reroute = RerouteService(
        state.db,
        dispatcher,
        hub,
        owner=lambda: runtime.identity.instance_id,
        settings=settings,
        max_attempts=state.settings.dispatch_max_attempts,
        append_log=agent_hub.append_log if agent_hub is not None else None,
        event_emitter=lambda: agent_hub.event_emitter if agent_hub is not None else None,
        on_effects=dispatcher.on_effects,
        on_job_changed=agent_hub.on_job_changed if agent_hub is not None else (lambda _job_id: None),
        secret_values=agent_hub.secret_values if agent_hub is not None else None,
        metrics=RerouteMetrics.create(state.metrics.registry),
        cancel_poll_s=state.settings.dispatch_poll_ms / 1000,
        ownership_check_timeout_ms=ownership_check_timeout_ms,
    )

    def view(instance_id: str, heartbeat: Heartbeat | None, connected: bool) -> WorkerView:
        return WorkerView(
            instance_id,
            connected,
            heartbeat.draining if heartbeat else False,
            heartbeat.agents if heartbeat else [],
            heartbeat.scalers if heartbeat else [],
        )

    def heard(session: PeerSession, heartbeat: Heartbeat) -> None:
        if session.peer_role == "worker":
            reroute.worker_seen(view(session.peer_id, heartbeat, True))

    previous_closed = hub.on_session_closed

    def closed(peer: str, code: int | None) -> None:
        previous_closed(peer, code)
        reroute.worker_gone(peer)

    async def job_messages(session: PeerSession, message: PeerMessage) -> bool:
        if session.peer_role != "worker":
            return False
        return await reroute.handle(session.peer_id, message)

    def job_arrivals(session: PeerSession, message: PeerMessage) -> None:
        if session.peer_role == "worker" and isinstance(message, JobRerouteAck):
            reroute.ack_arrived(session.peer_id, message)

    hub.heartbeat_observers.append(heard)
    hub.on_session_closed = closed
    hub.job_messages = job_messages
    hub.job_arrivals = job_arrivals
    hub.handle("job.cancel.relay", reroute.on_cancel_relay)
    state.parts.put(REROUTE, reroute)
    sweep_settings = state.parts.get(SWEEP_SETTINGS)
    if sweep_settings is not None:
        sweep_settings.rerouted_job_deferred = _flap_grace_check(state, hub)
        # A job only a worker can run waits for it instead of failing `unroutable`.
        sweep_settings.worker_note = reroute.wait_note
    instance_window = timedelta(milliseconds=runtime.stale_window_ms)

    async def sweep_windows(context: LeaderContext) -> None:
        # Layer A for lapsed spawn windows whose owning coordinator is not live (docs/design/cluster.md §4.4),
        # fenced.
        taken = await reroute.sweep_lapsed_windows(instance_window, context.fenced_transaction)
        if taken:
            log.info(
                "took back %d rerouted jobs whose spawn window lapsed under a coordinator not live", taken
            )

    runtime.leadership.register(
        LeaderTask("reroute-windows", state.settings.sweep_interval_ms, sweep_windows)
    )
    await reroute.start()
    return [reroute]


def _flap_grace_check(state: ClusterNode, hub: PeerHub) -> Callable[[str], Awaitable[bool]]:
    """The sweeps' predicate: is a rerouted job's worker connected, or heard from within the flap grace?"""
    from conveyor.runtime.boot import runtime_services

    runtime = runtime_services(state.parts)
    knob = CLUSTER_KNOBS_BY_NAME["reroute_flap_grace_ms"]

    async def deferred(worker: str) -> bool:
        value = await runtime.settings.cluster_value(knob.name)
        grace_ms = int(value if value is not None else state.settings.knob_default(knob) or 0)
        entry = hub.registry.get(worker)
        if entry is None:
            return False
        return within_flap_grace(
            connected=entry.connected,
            last_heard_age_ms=entry.heartbeat_age_ms(hub.registry.clock()),
            flap_grace_ms=grace_ms,
        )

    return deferred


async def _prune_join_tokens(context: LeaderContext) -> None:
    """Delete join tokens expired for more than a day (until then a late join still hears `token_expired`)."""
    async with context.fenced_transaction() as conn:
        now = await store.database_now(conn)
        pruned = await store.prune_join_tokens(conn, now - JOIN_TOKEN_KEEP_EXPIRED)
    if pruned:
        log.info("pruned %d expired join tokens", pruned)


async def wire_agent_token_revocation(state: ClusterNode) -> Sequence[Component]:
    """Coordinator hook, after the agent hub: a revoked agent token closes its agents on every coordinator.

    The agent hook's kicker closes this node's connections; this one also sends `agent_token.revoke` to
    each connected sibling coordinator, whose hub closes its own (docs/design/cluster.md §2.4). Workers
    are not told: their agents hold tokens the worker minted, never the database's. A sibling not
    connected now closes them at its hub's next token re-check (docs/design/execution.md §6).
    """
    hub = state.parts.get(PEER_HUB)
    agent_hub = state.parts.get(AGENT_HUB)
    local_kick = state.parts.get(KICKER)
    if state.settings.cluster_role != "coordinator" or hub is None or agent_hub is None or local_kick is None:
        return []

    async def kick(token_id: str) -> int:
        closed = await local_kick(token_id)
        notice = AgentTokenRevoke(token_id=token_id)
        for sibling in hub.connected("coordinator"):
            session = hub.session_for(sibling)
            if session is None:
                continue
            try:
                await session.send(notice)
            except SocketClosed:
                log.info("coordinator %s left before the revocation of agent token %s", sibling, token_id)
        return closed

    async def on_revoke(session: PeerSession, message: AgentTokenRevoke) -> None:
        if session.peer_role != "coordinator":
            log.warning(
                "ignored agent_token.revoke from %s: accepted from coordinators only", session.peer_id
            )
            return
        await agent_hub.kick_token(message.token_id)

    hub.handle("agent_token.revoke", on_revoke)
    state.parts.put(KICKER, kick)
    return []


async def wire_drain(state: ClusterNode) -> Sequence[Component]:
    """Coordinator hook, after dispatch and scaler: while draining, claim no queue row and spawn nothing."""
    drain = state.parts.get(DRAIN)
    if drain is None:
        return []
    dispatcher = state.parts.get(DISPATCHER)
    if dispatcher is not None:
        dispatcher.paused = lambda: drain.draining
        drain.on_change.append(lambda draining: None if draining else dispatcher.wake())
    scaler = state.parts.get(SCALER)
    if scaler is not None:
        scaler.draining = lambda: drain.draining
        drain.on_change.append(lambda draining: None if draining else scaler.wake())
    return []


def _worker_peer_hub(
    state: ClusterNode, instance_id: str, snapshot: WorkerSettingsSnapshot, drain: NodeDrain, urls: list[str]
) -> PeerHub:
    """A worker's peer hub: it dials every configured coordinator (join token or saved credential)."""
    settings = state.settings

    async def applied_settings_version() -> int:
        return snapshot.version

    hub = PeerHub(
        identity=HubIdentity(
            instance_id,
            "worker",
            VERSION,
            settings.cluster_advertise_url or default_advertise_url(settings.port),
        ),
        settings=_settings(state),
        home=settings.home,
        registry=_registry(state),
        join_token=settings.cluster_join_token,
        coordinator_urls=urls,
        settings_version=applied_settings_version,
        draining=lambda: drain.draining,
    )
    hub.handle("peer.drain.request", drain_request_handler(drain))
    return hub


def _worker_agent_hub(settings: ClusterSettings, worker: WorkerService, instance_id: str) -> AgentHub:
    """A worker's agent hub: an in-memory registry and dispatcher, its journal relayed through the outbox."""
    return AgentHub(
        None,
        worker.dispatcher,
        owner=lambda: instance_id,
        settings=AgentHubSettings(
            heartbeat_ms=min(15_000, settings.agent_dead_after_ms // 3),
            dead_after_ms=settings.agent_dead_after_ms,
            recovery_grace_ms=settings.recovery_grace_ms,
            max_attempts=settings.dispatch_max_attempts,
        ),
        append_log=None,
        on_effects=_no_effects,
        journal=worker.journal,
    )


def _install_worker_orphans(
    hub: PeerHub, worker: WorkerService, agent_hub: AgentHub, manager: ScalerManager, instance_id: str
) -> None:
    """A worker answers its coordinators' `scaler orphans --target` from memory (docs/design/scaler.md §7)."""

    async def orphan_facts() -> Facts:
        return worker_facts(
            instance_id,
            spawn_ids=[*manager.spawns, *worker.records.spawns],
            held_jobs=[(job.job_id, job.agent_id, job.bound_agent_id) for job in worker.jobs.values()],
            agents=list(agent_hub.connections),
            peers=[(entry.instance_id, entry.role, entry.connected) for entry in hub.registry.entries()],
        )

    worker_orphans = Orphans(manager, instance_id, orphan_facts)
    install_orphan_answers(hub, lambda: worker_orphans)


def _serve_settings_snapshots(
    hub: PeerHub, read_cluster_uncached: Callable[[], Awaitable[ClusterSettingsView]], db: Database
) -> None:
    """Answer workers' `cluster_settings.request` with the row and the shared scaler configuration
    (docs/design/cluster.md §5.3)."""

    async def read_scaler_config() -> SharedConfig | None:
        async with db.read() as conn:
            row = await scaler_store.read_shared_config(conn)
        return row.shared() if row is not None else None

    hub.handle(
        "cluster_settings.request", settings_request_handler(read_cluster_uncached, read_scaler_config)
    )


async def start_worker(state: ClusterNode) -> Sequence[Component]:
    """Worker hook: no database. Dial every configured coordinator (join token or saved credential), serve
    agents on `/ws` from an in-memory registry and dispatcher, run this worker's scalers, hold rerouted
    jobs, and relay their progress through the durable outbox."""
    from conveyor.model.ids import new_id
    from conveyor.scaler.startup import start_worker_scaler

    settings = state.settings
    instance_id = load_instance_id(settings.home, settings.instance_id)
    state.instance_id = instance_id
    set_instance_id(instance_id)
    urls = [u.strip() for u in (settings.cluster_coordinator_urls or "").split(",") if u.strip()]
    snapshot = WorkerSettingsSnapshot(
        snapshot_defaults(lambda name: settings.knob_default(CLUSTER_KNOBS_BY_NAME[name]))
    )
    drain = NodeDrain()
    hub = _worker_peer_hub(state, instance_id, snapshot, drain, urls)
    puller = SettingsPuller(snapshot, ask=hub.request)
    hub.heartbeat_observers.append(puller.observe)
    shutdown = WorkerShutdown(drain, drain_timeout_ms=settings.worker_drain_timeout_ms)
    state.parts.put(SETTINGS_SNAPSHOT, snapshot)
    state.parts.put(DRAIN, drain)
    state.parts.put(WORKER_SHUTDOWN, shutdown)
    # Fleet knobs come from the applied snapshot, read at each use (a spawn picks up a new TTL at once).
    knob = worker_knob(settings, snapshot)
    worker = WorkerService(
        instance_id=instance_id,
        outbox=Outbox(settings.home, metrics=OutboxMetrics.create(state.metrics.registry)),
        peers=hub,
        drain=drain,
        dispatch_ack_timeout_ms=await knob("dispatch_ack_timeout_ms", None),
    )
    agent_hub = _worker_agent_hub(settings, worker, instance_id)

    async def shared_scaler_config(_held: SharedConfig | None) -> SharedConfig | None:
        # The shared scaler configuration of the applied snapshot (docs/design/scaler.md §11).
        return snapshot.current().scaler_config

    manager, shared_watcher = await start_worker_scaler(
        state,
        records=worker.records,
        knob=knob,
        node_id=instance_id,
        boot_id=new_id(),
        connected=lambda: agent_hub.connections,
        draining=lambda: drain.draining,
        shared_source=shared_scaler_config,
    )
    puller.on_applied = lambda _snapshot: shared_watcher.wake()
    agent_hub.scaler_link = manager
    worker.scaler_wake = manager.wake
    worker.inventory = lambda: worker_inventory(agent_hub, manager)
    hub.inventory = worker.inventory
    hub.job_messages = worker.handle
    hub.on_session_opened = worker.session_opened
    _install_worker_orphans(hub, worker, agent_hub, manager, instance_id)
    install_reload_answers(hub, lambda: manager)
    state.parts.put(AGENT_HUB, agent_hub)
    state.parts.put(WORKER, worker)
    # The agents' artifact and cache routes, forwarded to a coordinator (docs/design/artifacts.md §4).
    proxy = TransferProxy(worker, metrics=ProxyMetrics.create(state.metrics.registry))
    await proxy.start()
    state.parts.put(TRANSFER_PROXY, proxy)
    resend = WakeableLoop("worker-outbox-resend", worker.resend_unacknowledged, RESEND_AFTER_S, log)
    await worker.dispatcher.start()
    await resend.start()
    await agent_hub.start()
    drain.jobs = worker
    await hub.start()
    state.parts.put(PEER_HUB, hub)
    log.info(
        "worker started: it joins its coordinators and runs the jobs they reroute to it on its own agents",
        extra={"instance_id": instance_id, "coordinators": urls},
    )
    # Stopped in reverse: the shutdown order runs first (drain, give back, wait, flush the outbox), then
    # the hub says `peer.leaving` (docs/design/cluster.md §8), then agents, the scaler and the dispatcher
    # stop.
    return [proxy, worker.dispatcher, resend, manager, shared_watcher, agent_hub, hub, puller, shutdown]


async def _no_effects(_effects: object) -> None:
    return None
