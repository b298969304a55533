"""Who this node knows in the cluster, and which of them are connected (docs/design/cluster.md §2.3).

The registry is in memory. A coordinator seeds it from the coordinator rows of `cluster_instances`
at boot, so a dead sibling stays *known* (and counts as disconnected in `/cluster/health`) until it is
forgotten. A peer that stops beating for `stale_beats` intervals is marked disconnected; its entry
keeps its last heartbeat and inventory. A peer that said `peer.leaving` is marked `left`: it shut down
cleanly, so it counts as gone at once (health ignores it, forget needs no liveness window) until it
connects again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from conveyor.cluster.messages import Heartbeat
from conveyor.model.ids import utc_now


def is_stale(last_heard: float, now: float, *, interval_ms: int, stale_beats: int) -> bool:
    """Whether a peer last heard at `last_heard` (monotonic s) has missed `stale_beats` beats by `now`."""
    return now - last_heard > interval_ms * stale_beats / 1000


@dataclass
class PeerEntry:
    """One known peer."""

    instance_id: str
    role: str
    connected: bool = False
    draining: bool = False
    # It said `peer.leaving` (a clean shutdown) and has not connected since.
    left: bool = False
    left_monotonic: float | None = None
    last_heartbeat_at: datetime | None = None
    last_heard_monotonic: float | None = None
    applied_settings_version: int = 0
    software_version: str | None = None
    heartbeat: Heartbeat | None = None

    def heartbeat_age_ms(self, now_monotonic: float) -> int | None:
        """Milliseconds since the last heartbeat (None if never heard from)."""
        if self.last_heard_monotonic is None:
            return None
        return max(0, int((now_monotonic - self.last_heard_monotonic) * 1000))


@dataclass
class PeerRegistry:
    """The known peers, by instance id; `on_change(instance_id, role, connected)` feeds the gauge."""

    clock: Callable[[], float] = time.monotonic
    wall_clock: Callable[[], datetime] = utc_now
    on_change: Callable[[str, str, bool], None] = lambda instance_id, role, connected: None
    _entries: dict[str, PeerEntry] = field(default_factory=dict)
    # How many entries `forget` removed: a reader of `cluster_instances` notes it before its read and
    # seeds from the rows only if no forget happened meanwhile (its rows may predate the forget).
    forgets: int = 0

    def seed(self, instance_id: str, role: str, *, forgets_seen: int | None = None) -> None:
        """Know a peer (disconnected) without having heard from it; with `forgets_seen`, only if no
        entry was forgotten since that count was read."""
        if forgets_seen is not None and forgets_seen != self.forgets:
            return
        if instance_id not in self._entries:
            self._entries[instance_id] = PeerEntry(instance_id, role)
            self.on_change(instance_id, role, False)

    def connected(self, instance_id: str, role: str) -> None:
        """A session authenticated: the role is the credential row's (or `coordinator` for an acceptor)."""
        entry = self._entries.setdefault(instance_id, PeerEntry(instance_id, role))
        entry.role, entry.connected = role, True
        entry.left, entry.left_monotonic = False, None
        entry.last_heard_monotonic = self.clock()
        self.on_change(instance_id, role, True)

    def disconnected(self, instance_id: str) -> None:
        """The peer's session ended, went stale, or it left."""
        entry = self._entries.get(instance_id)
        if entry is not None and entry.connected:
            entry.connected = False
            self.on_change(instance_id, entry.role, False)

    def left(self, instance_id: str) -> None:
        """The peer said `peer.leaving`: disconnected, and gone until it connects again."""
        self.disconnected(instance_id)
        entry = self._entries.get(instance_id)
        if entry is not None:
            entry.left, entry.left_monotonic = True, self.clock()

    def heard(self, heartbeat: Heartbeat, *, role: str) -> None:
        """Record a heartbeat (its role field is informational: the session's role stands)."""
        entry = self._entries.setdefault(heartbeat.instance_id, PeerEntry(heartbeat.instance_id, role))
        entry.last_heard_monotonic = self.clock()
        entry.last_heartbeat_at = self.wall_clock()
        entry.draining = heartbeat.draining
        entry.applied_settings_version = heartbeat.cluster_settings_version
        entry.software_version = heartbeat.software_version
        entry.heartbeat = heartbeat

    def get(self, instance_id: str) -> PeerEntry | None:
        """The entry of one peer."""
        return self._entries.get(instance_id)

    def entries(self) -> list[PeerEntry]:
        """Every known peer, by instance id."""
        return [self._entries[key] for key in sorted(self._entries)]

    def forget(self, instance_id: str) -> bool:
        """Remove a peer's entry; whether it existed."""
        entry = self._entries.pop(instance_id, None)
        self.forgets += 1
        if entry is not None and entry.connected:
            self.on_change(instance_id, entry.role, False)
        return entry is not None
