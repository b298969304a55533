"""Worker settings snapshots (docs/design/cluster.md §5.3): what a worker applies, when it pulls, what
coordinators serve.

A worker has no database. It applies the "agents, scaler" knobs of `cluster_settings`
(`WORKER_SNAPSHOT_KNOBS`) from a versioned snapshot `{version, settings}` that a coordinator
resolves from one uncached row read. The worker pulls when a coordinator's heartbeat advertises a
higher version than the one it applied, and self-heals when one coordinator advertises a lower
version for `SELF_HEAL_BEATS` beats in a row (the row went backwards: a restored database).

- `decide_settings_pull` is the pure decision, made at every coordinator heartbeat.
- `WorkerSettingsSnapshot` is the one object spawns read knobs through (`current()`).
- `SettingsPuller` runs the decision and the pull on a worker.
- `settings_request_handler` answers `cluster_settings.request` on a coordinator.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from conveyor.cluster.messages import (
    Heartbeat,
    PeerError,
    PeerMessage,
    SettingsRequest,
    SettingsResponse,
    SharedScalerConfig,
)
from conveyor.cluster.peer import PeerSession
from conveyor.cluster.service import PeerUnavailable
from conveyor.model.ids import new_id
from conveyor.model.knobs import CLUSTER_KNOBS_BY_NAME, WORKER_SNAPSHOT_KNOBS
from conveyor.parts import PartKey, Parts
from conveyor.runtime.settings import ClusterSettingsView, classify_settings_version
from conveyor.scaler.config import SharedConfig

log = logging.getLogger(__name__)

PULL_TIMEOUT_S = 10.0
SELF_HEAL_BEATS = 3

PullReason = Literal["newer", "restored"]


# --- the decision


@dataclass(frozen=True)
class PullDecision:
    """What to do at one coordinator heartbeat: pull (and why), and that coordinator's new lower-beat count."""

    pull: bool
    reason: PullReason | None
    lower_beats: int


def decide_settings_pull(
    *,
    applied: int,
    advertised: int,
    lower_beats: int,
    pull_in_flight: bool,
    self_heal_beats: int = SELF_HEAL_BEATS,
) -> PullDecision:
    """Whether a worker pulls a snapshot from the coordinator whose heartbeat advertises `advertised`.

    `applied` is the worker's applied version; `lower_beats` counts this coordinator's consecutive
    beats advertising a lower version. A higher version pulls at once ("newer"); a lower one pulls
    once after `self_heal_beats` beats in a row ("restored"), and the count starts over (so a failed
    self-heal pull is retried after as many beats again). An equal version resets the count. While a
    pull is in flight nothing new is pulled (one at a time); a failed "newer" pull is thus retried at
    the next beat that still advertises the higher version.
    """
    status = classify_settings_version(applied, advertised)
    if status == "in-sync":
        return PullDecision(False, None, 0)
    if status == "behind":
        return PullDecision(not pull_in_flight, None if pull_in_flight else "newer", 0)
    beats = lower_beats + 1
    if beats >= self_heal_beats and not pull_in_flight:
        return PullDecision(True, "restored", 0)
    return PullDecision(False, None, min(beats, self_heal_beats))


def adopts_served_snapshot(*, applied: int, served: int, reason: PullReason) -> bool:
    """Whether a served snapshot replaces the applied one.

    A self-heal pull adopts whatever it is served, even a lower version: the row went backwards and
    the coordinators now serve that. A "newer" pull adopts only a higher version, so a coordinator
    answering from a lagging read never moves the worker backwards.
    """
    return reason == "restored" or served > applied


# --- what a worker applies


def snapshot_defaults(knob_default: Callable[[str], int | None]) -> dict[str, int]:
    """The worker's local defaults of every snapshot knob (env/YAML, else built-in)."""
    values: dict[str, int] = {}
    for name in WORKER_SNAPSHOT_KNOBS:
        value = knob_default(name)
        values[name] = int(value if value is not None else CLUSTER_KNOBS_BY_NAME[name].default or 0)
    return values


@dataclass(frozen=True)
class SettingsSnapshot:
    """One applied snapshot: a version and every snapshot knob's value (never a mix of two versions)."""

    version: int
    settings: Mapping[str, int]
    served_by: str | None = None
    # The shared scaler configuration served with this version (docs/design/scaler.md §11).
    scaler_config: SharedConfig | None = None

    def value(self, name: str) -> int:
        """A snapshot knob's value (`KeyError` for a knob a worker does not apply)."""
        return self.settings[name]

    @property
    def agent_token_ttl_ms(self) -> int:
        """TTL of the `cvy_agent_` tokens the worker mints for agents its scalers spawn."""
        return self.settings["agent_token_ttl_ms"]

    @property
    def firecracker_api_socket_wait_ms(self) -> int:
        """How long the firecracker backend waits for a VM's API socket."""
        return self.settings["firecracker_api_socket_wait_ms"]


class WorkerSettingsSnapshot:
    """The worker's applied cluster-settings snapshot: the one place spawns read fleet knobs from.

    Published on a worker as `state.parts["settings_snapshot"]` (`SERVICE_KEY`); find it with
    `worker_settings_snapshot(state.parts)`.

    - `current()` → the applied `SettingsSnapshot` (frozen). Read it once per spawn and take every knob
      from that one object, e.g. `snap = snapshot.current(); ttl_ms = snap.agent_token_ttl_ms`, so one
      spawn never mixes two versions. `snap.value("scaler_provision_backoff_base_ms")` reads any knob of
      `WORKER_SNAPSHOT_KNOBS` (the "agents, scaler" group of docs/design/cluster.md §5.1).
    - `version` → the applied version (0 before the first pull), as the worker's heartbeats advertise.
    - `value(name)` → a knob of the current snapshot (shorthand for `current().value(name)`).
    - `apply(version, settings, served_by)` → swap in a served snapshot atomically (the puller does this).

    Before the first pull it holds the worker's env/YAML defaults at version 0.
    """

    def __init__(self, defaults: Mapping[str, int]) -> None:
        missing = set(WORKER_SNAPSHOT_KNOBS) - set(defaults)
        if missing:
            raise ValueError(f"no default for snapshot knobs {sorted(missing)}")
        self._defaults = dict(defaults)
        self._current = SettingsSnapshot(0, MappingProxyType(dict(self._defaults)), None)

    def current(self) -> SettingsSnapshot:
        """The applied snapshot."""
        return self._current

    @property
    def version(self) -> int:
        """The applied version (0 before the first pull)."""
        return self._current.version

    def value(self, name: str) -> int:
        """One knob of the applied snapshot."""
        return self._current.value(name)

    def apply(
        self,
        version: int,
        settings: Mapping[str, int | None],
        served_by: str | None = None,
        scaler_config: SharedConfig | None = None,
    ) -> SettingsSnapshot:
        """Swap in a served snapshot; a field missing (or null) falls back to the local default."""
        values = {
            name: int(value) if isinstance((value := settings.get(name)), int) else self._defaults[name]
            for name in WORKER_SNAPSHOT_KNOBS
        }
        # One reference assignment: a reader sees the old snapshot or the new one, never a mix.
        self._current = SettingsSnapshot(version, MappingProxyType(values), served_by, scaler_config)
        return self._current


SETTINGS_SNAPSHOT = PartKey[WorkerSettingsSnapshot]("settings_snapshot")
"""The worker's snapshot, if this node is a started worker."""


def settings_check(parts: Parts) -> dict[str, object]:
    """The worker's `/ready` `settings` check: the snapshot it holds (version 0: its env defaults)."""
    snapshot = parts.get(SETTINGS_SNAPSHOT)
    if snapshot is None:
        return {"ok": False, "detail": "no cluster-settings snapshot yet: the worker is starting"}
    current = snapshot.current()
    source = f"served by {current.served_by}" if current.served_by else "env defaults, nothing pulled yet"
    return {
        "ok": True,
        "detail": f"cluster settings version {current.version} ({source})",
        "version": current.version,
        "values": dict(current.settings),
    }


# --- the worker's puller

# `PeerHub.request`: send a request to a peer and wait for its answer (`PeerUnavailable`, `TimeoutError`).
Ask = Callable[[str, Any, float], Awaitable[Any]]


@dataclass
class SettingsPuller:
    """Watches coordinator heartbeats and pulls snapshots into `snapshot` (one pull in flight)."""

    snapshot: WorkerSettingsSnapshot
    ask: Ask
    timeout_s: float = PULL_TIMEOUT_S
    self_heal_beats: int = SELF_HEAL_BEATS
    on_applied: Callable[[SettingsSnapshot], None] = lambda snapshot: None
    _lower_beats: dict[str, int] = field(default_factory=dict)
    _pulling: asyncio.Task[SettingsSnapshot | None] | None = None

    @property
    def pull_in_flight(self) -> bool:
        """Whether a pull has been sent and not finished."""
        return self._pulling is not None and not self._pulling.done()

    def observe(self, session: PeerSession, heartbeat: Heartbeat) -> None:
        """A heartbeat arrived (hub observer): decide, and start a pull when one is due."""
        if session.peer_role != "coordinator":
            return
        peer = session.peer_id
        decision = decide_settings_pull(
            applied=self.snapshot.version,
            advertised=heartbeat.cluster_settings_version,
            lower_beats=self._lower_beats.get(peer, 0),
            pull_in_flight=self.pull_in_flight,
            self_heal_beats=self.self_heal_beats,
        )
        self._lower_beats[peer] = decision.lower_beats
        if decision.pull and decision.reason is not None:
            # A task, not awaited here: the answer arrives through the same session's reader.
            self._pulling = asyncio.create_task(
                self.pull(peer, decision.reason), name=f"settings-pull-{peer}"
            )

    async def pull(self, peer: str, reason: PullReason) -> SettingsSnapshot | None:
        """Ask `peer` for its snapshot and apply it if due; the applied snapshot, or None (logged)."""
        try:
            answer = await self.ask(peer, SettingsRequest(message_id=new_id()), self.timeout_s)
        except PeerUnavailable:
            log.warning(
                "settings pull from %s failed: the session closed (retried at its next heartbeat)", peer
            )
            return None
        except TimeoutError:
            log.warning(
                "settings pull from %s got no answer within %g s (retried at its next heartbeat)",
                peer,
                self.timeout_s,
            )
            return None
        if not isinstance(answer, SettingsResponse):
            detail = f"{answer.error}: {answer.detail}" if isinstance(answer, PeerError) else answer.type
            log.warning("settings pull from %s was refused (retried at its next heartbeat): %s", peer, detail)
            return None
        applied = self.snapshot.version
        if not adopts_served_snapshot(applied=applied, served=answer.version, reason=reason):
            log.info("kept settings version %d: %s served version %d", applied, peer, answer.version)
            return None
        shared = answer.scaler_config
        snapshot = self.snapshot.apply(
            answer.version,
            answer.settings,
            served_by=peer,
            scaler_config=SharedConfig(shared.version, shared.content, shared.sha256) if shared else None,
        )
        log.info(
            "applied cluster settings version %d from %s (%s; was %d)", answer.version, peer, reason, applied
        )
        self.on_applied(snapshot)
        return snapshot

    async def start(self) -> None:
        """Pulls start from heartbeats (the hub calls `observe`)."""

    async def stop(self) -> None:
        """Cancel a pull in flight."""
        if self._pulling is not None:
            self._pulling.cancel()
            await asyncio.gather(self._pulling, return_exceptions=True)


# --- the coordinator's answer


def snapshot_settings(view: ClusterSettingsView) -> dict[str, int | None]:
    """Every snapshot knob's value in one row view: the stored override, else this coordinator's default."""
    return {name: view.effective.get(name) for name in WORKER_SNAPSHOT_KNOBS}


def settings_request_handler(
    read_uncached: Callable[[], Awaitable[ClusterSettingsView]],
    read_scaler_config: Callable[[], Awaitable[SharedConfig | None]] | None = None,
) -> Callable[[PeerSession, SettingsRequest], Awaitable[PeerMessage]]:
    """The coordinator's `cluster_settings.request` answer: one uncached row read, version and values together,
    then the shared scaler configuration: read after the row, it is never older than the version it is served
    with (a set bumps both in one transaction)."""

    async def answer(session: PeerSession, message: SettingsRequest) -> PeerMessage:
        try:
            view = await read_uncached()
            shared = await read_scaler_config() if read_scaler_config is not None else None
        except Exception as exc:  # the database is unreachable: the worker retries at the next beat
            log.warning("could not read cluster settings for %s: %s", session.peer_id, exc)
            return PeerError(
                message_id=message.message_id, error="unavailable", detail="cluster settings unreadable"
            )
        return SettingsResponse(
            message_id=message.message_id,
            version=view.version,
            settings=snapshot_settings(view),
            scaler_config=(
                SharedScalerConfig(version=shared.version, content=shared.content, sha256=shared.sha256)
                if shared is not None
                else None
            ),
        )

    return answer
