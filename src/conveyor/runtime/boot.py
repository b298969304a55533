"""The runtime start-up hooks: identity, boot checks, heartbeat, settings resolver, leadership.

`prepare` (first) decides who this process will be and publishes a `BootServices` (identity, settings
reads) for the hooks that serve before the identity is settled; `start` settles it (waiting out a crashed
predecessor's live row behind an open listener on PostgreSQL) and publishes one `RuntimeServices` in
`state.parts` for the routes and for later hooks:
`runtime_services(state.parts).leadership.register(LeaderTask(...))`,
`await runtime_services(state.parts).settings.org_value(org_id, "reroute_max_hops")`.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from conveyor.model.ids import new_id
from conveyor.model.knobs import ALL_KNOBS
from conveyor.parts import PartKey, Parts
from conveyor.runtime import store
from conveyor.runtime.instances import (
    BootRefused,
    Identity,
    InstanceHeartbeat,
    default_advertise_url,
    load_instance_id,
    stale_window,
)
from conveyor.runtime.lease import LeaderContext, Leadership, LeaderTask
from conveyor.runtime.node import (
    BootProgress,
    Component,
    FatalStartupError,
    Node,
    NodeMetrics,
    NodeSettings,
    set_instance_id,
)
from conveyor.runtime.settings import SettingsResolver
from conveyor.version import VERSION

if TYPE_CHECKING:
    from prometheus_client import Counter, Gauge

log = logging.getLogger(__name__)

SQLITE_ONE_COORDINATOR = "SQLite supports one coordinator; use PostgreSQL"
# Test hook (inert unless set): a leader task that makes one fenced write every N ms.
TEST_LEADER_WRITE_ENV = "CONVEYOR_TEST_LEADER_WRITE_MS"
TEST_LEADER_WRITE_KEY_PREFIX = "test.leader_write."


@dataclass(frozen=True)
class RuntimeServices:
    """What the runtime core offers the rest of the server."""

    identity: Identity
    settings: SettingsResolver
    leadership: Leadership
    heartbeat: InstanceHeartbeat
    stale_window_ms: int


class RuntimeSettings(NodeSettings, Protocol):
    """What the runtime core reads of the node's configuration."""

    port: int
    database_url: str | None
    cluster_advertise_url: str | None
    cluster_heartbeat_interval_ms: int
    cluster_peer_stale_beats: int
    cluster_lease_ttl_ms: int
    cluster_lease_renew_ms: int
    cluster_settings_cache_ttl_ms: int


class RuntimeMetrics(NodeMetrics, Protocol):
    """The node's collectors the runtime core updates."""

    leader: Gauge
    leader_epoch: Gauge
    cluster_settings_read_errors: Counter


class RuntimeNode(Node, Protocol):
    """The node as the runtime hook sees it."""

    # Set when this process holds the `$CONVEYOR_HOME` lock (a live-looking row of this home is a crashed
    # predecessor's).
    home_locked: bool

    @property
    def startup(self) -> BootProgress: ...

    @property
    def settings(self) -> RuntimeSettings: ...

    @property
    def metrics(self) -> RuntimeMetrics: ...


@dataclass(frozen=True)
class BootServices:
    """What the runtime core offers before this node's identity is settled (no heartbeat, no lease yet)."""

    identity: Identity
    settings: SettingsResolver


RUNTIME = PartKey[RuntimeServices]("runtime")
BOOT = PartKey[BootServices]("runtime.boot")


def runtime_services(parts: Parts) -> RuntimeServices:
    """The runtime services a started server published (`state.parts`)."""
    return parts.need(RUNTIME)


def boot_services(parts: Parts) -> BootServices:
    """The identity and settings reads `prepare` published."""
    return parts.need(BOOT)


def identity_wait_detail(reason: str, window_s: float) -> str:
    """What `/ready` says while a restarted node waits for its predecessor's row to go stale."""
    return (
        "identity: waiting for the previous instance's heartbeat to go stale "
        f"(at most {window_s:g} s after its last beat): {reason}"
    )


async def prepare(state: RuntimeNode) -> Sequence[Component]:
    """First start-up hook: this process's identity (not yet settled) and the settings resolver."""
    settings = state.settings
    identity = Identity(
        instance_id=load_instance_id(settings.home, settings.instance_id),
        boot_id=new_id(),
        role=settings.cluster_role,
        advertise_url=settings.cluster_advertise_url or default_advertise_url(settings.port),
        software_version=VERSION,
    )
    state.instance_id = identity.instance_id
    set_instance_id(identity.instance_id)
    resolver = SettingsResolver(
        db=state.db,
        defaults={knob.name: settings.knob_default(knob) for knob in ALL_KNOBS},
        cache_ttl_ms=settings.cluster_settings_cache_ttl_ms,
        on_read_error=state.metrics.cluster_settings_read_errors.inc,
    )
    state.parts.put(BOOT, BootServices(identity=identity, settings=resolver))
    return []


async def start(state: RuntimeNode) -> Sequence[Component]:
    """Start-up hook: refuses to boot next to a live twin or a second SQLite coordinator.

    A live row of our own instance id may be a crashed predecessor's: on PostgreSQL the listener opens
    while this waits for it to go stale (webhooks are stored meanwhile, `/ready` says why it is not
    ready); the hooks after this one, leadership and dispatch among them, run once it is settled.
    """
    settings = state.settings
    boot = boot_services(state.parts)
    identity, resolver = boot.identity, boot.settings

    async def served_settings_version() -> int:
        # Refresh through the cache so the heartbeat reports what reads serve right now.
        return (await resolver.cluster()).version

    window = stale_window(settings.cluster_heartbeat_interval_ms, settings.cluster_peer_stale_beats)
    heartbeat = InstanceHeartbeat(
        db=state.db,
        identity=identity,
        interval_ms=settings.cluster_heartbeat_interval_ms,
        applied_settings_version=served_settings_version,
    )

    def waiting(reason: str) -> None:
        # SQLite keeps waiting before it listens: its only wait is for a second coordinator on one file,
        # which is refused, and a refused node should not have answered anything first.
        if state.db.dialect == "postgresql":
            state.startup.listen_while(identity_wait_detail(reason, window.total_seconds()))

    try:
        await heartbeat.check_boot(
            window=window,
            dialect=state.db.dialect,
            predecessor_crashed=state.home_locked and settings.database_url is None,
            on_wait=waiting,
        )
    except BootRefused as exc:
        raise FatalStartupError(str(exc)) from exc
    state.startup.waiting = None
    await heartbeat.start()

    def leadership_changed(leading: bool, epoch: int | None) -> None:
        state.metrics.leader.set(1 if leading else 0)
        if epoch is not None:
            state.metrics.leader_epoch.set(epoch)

    leadership = Leadership(
        state.db,
        holder=identity.instance_id,
        ttl_ms=settings.cluster_lease_ttl_ms,
        renew_ms=settings.cluster_lease_renew_ms,
        on_change=leadership_changed,
    )
    components: list[Component] = [heartbeat]
    # Only coordinators lead: a worker never runs cluster-singleton work (docs/design/cluster.md §1).
    if identity.role == "coordinator":
        if state.db.dialect == "sqlite":
            # The single SQLite node always leads; if someone else holds a live lease on this
            # file for a whole TTL, that is a second coordinator.
            if not await leadership.acquire_within(settings.cluster_lease_ttl_ms):
                await heartbeat.stop()
                raise FatalStartupError(SQLITE_ONE_COORDINATOR)
        await leadership.start()
        components.append(leadership)

    test_interval = os.environ.get(TEST_LEADER_WRITE_ENV)
    if test_interval:
        leadership.register(
            LeaderTask("test-fenced-write", int(test_interval), _test_fenced_write(identity.instance_id))
        )

    state.parts.put(
        RUNTIME,
        RuntimeServices(
            identity=identity,
            settings=resolver,
            leadership=leadership,
            heartbeat=heartbeat,
            stale_window_ms=int(window.total_seconds() * 1000),
        ),
    )
    log.info("runtime started", extra={"instance_id": identity.instance_id, "boot_id": identity.boot_id})
    return components


def _test_fenced_write(holder: str) -> Callable[[LeaderContext], Awaitable[None]]:
    async def run(context: LeaderContext) -> None:
        async with context.fenced_transaction() as conn:
            at = await store.database_now(conn)
            value = json.dumps({"holder": holder, "epoch": context.epoch, "at": at.isoformat()})
            await store.insert_test_leader_write(conn, TEST_LEADER_WRITE_KEY_PREFIX + new_id(), value)

    return run
