"""The runtime start-up hook: identity, boot checks, heartbeat, settings resolver, leadership.

It publishes one `RuntimeServices` in `state.services` for the routes and for later hooks:
`runtime_services(state.services).leadership.register(LeaderTask(...))`,
`await runtime_services(state.services).settings.org_value(org_id, "reroute_max_hops")`.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from conveyor.model.ids import new_id
from conveyor.model.knobs import ALL_KNOBS
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
from conveyor.runtime.settings import SettingsResolver
from conveyor.version import VERSION

if TYPE_CHECKING:
    from conveyor.server.state import Component, ServerState

log = logging.getLogger("conveyor.runtime")

SERVICE_KEY = "runtime"
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


def runtime_services(services: Mapping[str, object]) -> RuntimeServices:
    """The runtime services a started server published (`state.services`)."""
    found = services.get(SERVICE_KEY)
    if not isinstance(found, RuntimeServices):
        raise LookupError("the runtime core has not started")
    return found


async def start(state: ServerState) -> Sequence[Component]:
    """Start-up hook: refuses to boot next to a live twin or a second SQLite coordinator."""
    from conveyor.server.logs import set_instance_id
    from conveyor.server.startup import FatalStartupError

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
    try:
        await heartbeat.check_boot(
            window=window,
            dialect=state.db.dialect,
            predecessor_crashed=state.home_locked and settings.database_url is None,
        )
    except BootRefused as exc:
        raise FatalStartupError(str(exc)) from exc
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

    state.services[SERVICE_KEY] = RuntimeServices(
        identity=identity,
        settings=resolver,
        leadership=leadership,
        heartbeat=heartbeat,
        stale_window_ms=int(window.total_seconds() * 1000),
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
