"""The scaler start-up hook: configuration, the manager, its links to the hub and the sweep, SIGHUP.

Runs after the dispatch hook (it needs `agent_hub`, `dispatcher` and `sweep_settings`). A bad
`scalers.yaml` at boot stops the node with every problem listed; with no file, `conveyor up` runs
the built-in `local` bare-metal scaler and `conveyor server` runs none (reload can add scalers).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

from conveyor.agents.hub import AGENT_HUB
from conveyor.events.models import EventSettings
from conveyor.events.startup import EVENTS, EventsConfig, event_settings
from conveyor.execution.dispatcher import DISPATCHER
from conveyor.execution.sweeps import SWEEP_SETTINGS
from conveyor.model.knobs import CLUSTER_KNOBS_BY_NAME, ORG_KNOBS_BY_NAME
from conveyor.model.platforms import arch_name, os_name
from conveyor.runtime.lease import LeaderContext, LeaderTask
from conveyor.runtime.node import Component, FatalStartupError, Node
from conveyor.scaler.backend import BackendContext
from conveyor.scaler.backstop import COORDINATOR_PEERS, BackstopKnobs, ScalerBackstop
from conveyor.scaler.config import (
    Host,
    ScalerConfig,
    ScalerConfigError,
    SharedConfig,
    builtin_local_notice,
    has_local_config,
    load_config,
    worker_refusal,
)
from conveyor.scaler.manager import ManagerSettings, ReloadInProgress, ScalerManager
from conveyor.scaler.metrics import ScalerMetrics
from conveyor.scaler.orphans import Orphans, database_facts
from conveyor.scaler.records import SpawnRecords
from conveyor.scaler.registry import backend_registry
from conveyor.scaler.routes import ORPHANS, SCALER
from conveyor.scaler.shared import SHARED_CONFIG, SharedConfigWatcher, Source, database_source

log = logging.getLogger(__name__)


class ScalerSettings(EventsConfig, Protocol):
    """What the scaler hooks read of the node's configuration (the event settings for the `event` backend)."""

    host: str
    port: int
    orchestrator_url: str | None
    scaler_config: Path | None
    scaler_config_dir: Path | None
    scaler_builtin_local: bool
    scaler_poll_ms: int
    cluster_settings_cache_ttl_ms: int


class ScalerNode(Node, Protocol):
    """The node as the scaler hooks see it."""

    @property
    def settings(self) -> ScalerSettings: ...


def orchestrator_url(settings: ScalerSettings) -> str:
    """What spawned agents dial: `CONVEYOR_ORCHESTRATOR_URL`, else this node's own `/ws`."""
    if settings.orchestrator_url:
        return settings.orchestrator_url
    host = settings.host
    if host in ("0.0.0.0", "", "::"):
        host = "127.0.0.1"
    elif ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"ws://{host}:{settings.port}/ws"


def _install_sighup(manager: ScalerManager) -> bool:
    """Reload on SIGHUP (POSIX, main thread only); the outcome is logged."""
    if sys.platform == "win32":
        return False

    async def reload() -> None:
        try:
            result = await manager.reload()
            log.info("scaler reload on SIGHUP applied: %s", ", ".join(result["scalers"]) or "no scalers")
        except ScalerConfigError as exc:
            log.error("scaler reload on SIGHUP refused, the running configuration was kept: %s", exc)
        except ReloadInProgress:
            log.warning("scaler reload on SIGHUP skipped: another reload is in progress")

    def handler() -> None:
        manager._spawn_task(reload(), "scaler-reload-sighup")

    try:
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, handler)
    except (NotImplementedError, RuntimeError, ValueError):
        return False
    return True


class _SighupComponent:
    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        with contextlib.suppress(Exception):
            asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)


def _uses_local(settings: ScalerSettings) -> Callable[[], bool]:
    def uses_local() -> bool:
        return has_local_config(settings.home, settings.scaler_config, settings.scaler_config_dir)

    return uses_local


def _loader(
    settings: ScalerSettings, watcher: SharedConfigWatcher, *, worker: bool
) -> tuple[Callable[[], ScalerConfig], Callable[[], ScalerConfig], Any]:
    """(load, load without the shared configuration, the backend registry)."""
    host = Host(os=os_name(), arch=arch_name())
    registry = backend_registry()

    def load_with(shared: SharedConfig | None) -> ScalerConfig:
        config = load_config(
            settings.home,
            main=settings.scaler_config,
            directory=settings.scaler_config_dir,
            builtin=settings.scaler_builtin_local,
            host=host,
            registry=registry,
            shared=shared,
        )
        if worker and config.origin == "shared":
            config = without_event_scalers(config)
        return config

    return (lambda: load_with(watcher.current)), (lambda: load_with(None)), registry


def without_event_scalers(config: ScalerConfig) -> ScalerConfig:
    """A worker's view of the shared configuration: its `event` scalers left out (their claims live in the
    database, docs/design/scaler.md §11)."""
    names = [entry.name for entry in config.entries if entry.type == "event"]
    if not names:
        return config
    log.info(
        "shared scaler configuration: scaler %s (type event) runs on coordinators only", ", ".join(names)
    )
    return replace(config, entries=tuple(entry for entry in config.entries if entry.type != "event"))


def _load_or_fail(
    load: Callable[[], ScalerConfig], without_shared: Callable[[], ScalerConfig], watcher: SharedConfigWatcher
) -> ScalerConfig:
    """The boot configuration: a bad local file stops the node; a stored shared configuration this host
    refuses does not (it was valid where it was set): the node runs without it and says why."""
    try:
        return load()
    except ScalerConfigError as exc:
        if watcher.current is None or watcher.uses_local():
            raise FatalStartupError(f"the scaler configuration is invalid: {exc}") from exc
        watcher.error = "; ".join(exc.problems)
        log.error(
            "shared scaler configuration version %d refused on this node, started without it: %s",
            watcher.current.version,
            watcher.error,
        )
    try:
        return without_shared()
    except ScalerConfigError as exc:
        raise FatalStartupError(f"the scaler configuration is invalid: {exc}") from exc


def _poll_s(settings: ScalerSettings) -> float:
    """How often a coordinator looks for a new shared version: the settings cache's TTL (at least 200 ms)."""
    return max(settings.cluster_settings_cache_ttl_ms, 200) / 1000


async def start_worker_scaler(
    state: ScalerNode,
    *,
    records: SpawnRecords,
    knob: Callable[[str, str | None], Awaitable[int]],
    node_id: str,
    boot_id: str,
    connected: Callable[[], Any],
    draining: Callable[[], bool],
    shared_source: Source,
) -> tuple[ScalerManager, SharedConfigWatcher]:
    """A worker's scaler manager: its own `scalers.yaml`, else the shared one of its settings snapshot
    (`shared_source`); spawn records kept by the worker (no database)."""
    settings = state.settings
    watcher = SharedConfigWatcher(shared_source, uses_local=_uses_local(settings), poll_s=_poll_s(settings))
    await watcher.refresh()
    load, without_shared, registry = _loader(settings, watcher, worker=True)
    config = _load_or_fail(load, without_shared, watcher)
    refusal = worker_refusal(config)
    if refusal:
        raise FatalStartupError(refusal)

    async def cluster_setting(name: str) -> int:
        return await knob(name, None)

    manager = ScalerManager(
        records=records,
        context=BackendContext(
            home=settings.home, node_id=node_id, boot_id=boot_id, cluster_setting=cluster_setting
        ),
        config=config,
        registry=registry,
        settings=ManagerSettings(
            orchestrator_url=orchestrator_url(settings),
            loop_poll_s=settings.scaler_poll_ms / 1000,
        ),
        knob=knob,
        load_config=load,
        connected=connected,
        draining=draining,
        metrics=ScalerMetrics(state.metrics.registry),
    )
    manager.metrics.watch(manager)
    state.parts.put(SCALER, manager)
    watcher.manager = manager
    state.parts.put(SHARED_CONFIG, watcher)
    await manager.start()
    await watcher.start()
    if config.entries:
        log.info(
            "scaler started: %s",
            ", ".join(f"{e.name} ({e.type}, max {e.max_agents})" for e in config.entries),
        )
    return manager, watcher


async def _coordinator_config(
    state: ScalerNode, settings_version: Callable[[], Awaitable[int]]
) -> tuple[SharedConfigWatcher, Callable[[], ScalerConfig], Any, ScalerConfig]:
    """A coordinator's watcher of the shared configuration (the stored version taken), its loader, the
    backend registry and the boot configuration."""
    settings = state.settings
    watcher = SharedConfigWatcher(
        database_source(state.db, settings_version),
        uses_local=_uses_local(settings),
        poll_s=_poll_s(settings),
    )
    await watcher.refresh()
    load, without_shared, registry = _loader(settings, watcher, worker=False)
    return watcher, load, registry, _load_or_fail(load, without_shared, watcher)


async def start(state: ScalerNode) -> Sequence[Component]:
    """Start-up hook: publishes `SCALER` and `ORPHANS`."""
    from conveyor.runtime.boot import runtime_services

    settings = state.settings
    if settings.cluster_role != "coordinator":
        return []  # a worker starts its scaler from the cluster hook (`start_worker_scaler`)
    runtime = runtime_services(state.parts)

    async def settings_version() -> int:
        return (await runtime.settings.cluster()).version

    watcher, load, registry, config = await _coordinator_config(state, settings_version)
    hub = state.parts.get(AGENT_HUB)

    async def knob(name: str, org_id: str | None) -> int:
        if name in ORG_KNOBS_BY_NAME and org_id is not None:
            value = await runtime.settings.org_value(org_id, name)
            definition = ORG_KNOBS_BY_NAME[name]
        elif name in ORG_KNOBS_BY_NAME:
            value = await runtime.settings.org_value("default", name)
            definition = ORG_KNOBS_BY_NAME[name]
        else:
            value = await runtime.settings.cluster_value(name)
            definition = CLUSTER_KNOBS_BY_NAME[name]
        if value is None:
            value = settings.knob_default(definition)
        if value is None:
            value = definition.default
        return int(value or 0)

    async def cluster_setting(name: str) -> int:
        return await knob(name, None)

    def current_event_settings() -> EventSettings:
        # The events hook starts after this one: until it has, the settings it will start with.
        service = state.parts.get(EVENTS)
        return service.settings if service is not None else event_settings(settings)

    context = BackendContext(
        home=settings.home,
        node_id=runtime.identity.instance_id,
        boot_id=runtime.identity.boot_id,
        cluster_setting=cluster_setting,
        database=state.db,
        event_settings=current_event_settings,
    )

    def connected() -> Any:
        return hub.connections if hub is not None else {}

    manager = ScalerManager(
        db=state.db,
        context=context,
        config=config,
        registry=registry,
        settings=ManagerSettings(
            orchestrator_url=orchestrator_url(settings),
            loop_poll_s=settings.scaler_poll_ms / 1000,
        ),
        knob=knob,
        load_config=load,
        connected=connected,
        metrics=ScalerMetrics(state.metrics.registry),
    )
    manager.metrics.watch(manager)
    if hub is not None:
        hub.scaler_link = manager
    dispatcher = state.parts.get(DISPATCHER)
    if dispatcher is not None:
        dispatcher.also_wake.append(manager.wake)
    sweep_settings = state.parts.get(SWEEP_SETTINGS)
    if sweep_settings is not None:
        sweep_settings.scalable = manager.wait_note
    state.parts.put(SCALER, manager)
    node_id = runtime.identity.instance_id
    stale_window = timedelta(milliseconds=runtime.stale_window_ms)
    state.parts.put(
        ORPHANS, Orphans(manager, node_id, database_facts(manager, state.db, node_id, stale_window))
    )
    await manager.start()
    if config.entries:
        log.info(
            "scaler started: %s",
            ", ".join(f"{e.name} ({e.type}, max {e.max_agents})" for e in config.entries),
        )
    notice = builtin_local_notice(config, settings.home)
    if notice:
        # For the person at the terminal of `conveyor up`, whatever the log format.
        sys.stderr.write(notice + "\n")
        sys.stderr.flush()
    _register_backstop(state, manager, knob)
    watcher.manager = manager
    state.parts.put(SHARED_CONFIG, watcher)
    await watcher.start()
    components: list[Component] = [manager, watcher]
    if _install_sighup(manager):
        components.append(_SighupComponent())
    return components


def _register_backstop(
    state: ScalerNode, manager: ScalerManager, knob: Callable[[str, str | None], Awaitable[int]]
) -> None:
    """The leader-only stranded-provision reaper (docs/design/cluster.md §7.2)."""
    from conveyor.runtime.boot import runtime_services

    runtime = runtime_services(state.parts)
    me = runtime.identity.instance_id

    async def knobs() -> BackstopKnobs:
        return BackstopKnobs(
            interval_ms=await knob("scaler_reap_interval_ms", None),
            flap_grace_ms=await knob("reroute_flap_grace_ms", None),
            stranded_timeout_ms=await knob("scaler_reap_stranded_timeout_ms", None),
        )

    def peers() -> tuple[dict[str, datetime], frozenset[str], int]:
        # The cluster hook publishes its view before this hook on a coordinator; absent, this node knows no peer.
        view = state.parts.get(COORDINATOR_PEERS)
        return view() if view is not None else ({}, frozenset(), 0)

    backstop = ScalerBackstop(
        state.db,
        manager,
        me=me,
        stale_window_ms=runtime.stale_window_ms,
        knobs=knobs,
        peers=peers,
        stops_compute=lambda: bool(manager.status()),
    )

    async def run(context: LeaderContext) -> None:
        await backstop.tick(context.fenced_transaction)

    # The task wakes at the sweep interval; a pass runs when `scaler_reap_interval_ms` (live) has elapsed.
    runtime.leadership.register(LeaderTask("scaler-backstop", state.settings.sweep_interval_ms, run))
