"""The peer hub's upkeep loops: the stale check (both ends), and on coordinators the revocation backstop
and sibling discovery (docs/design/cluster.md §2)."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from conveyor.cluster import store
from conveyor.cluster.channel import CLOSE_NORMAL, CLOSE_REVOKED
from conveyor.cluster.registry import is_stale

if TYPE_CHECKING:
    from conveyor.cluster.service import PeerHub

log = logging.getLogger(__name__)


class PeerUpkeep:
    """Closes stale and revoked sessions, and keeps the registry's coordinators and their dialers current."""

    def __init__(self, hub: PeerHub) -> None:
        self.hub = hub

    async def check_stale(self) -> list[str]:
        """Close sessions whose peer missed `stale_beats` beats; their ids."""
        now = self.hub.clock()
        stale = [
            pid
            for pid, session in self.hub.sessions.items()
            if is_stale(
                session.last_heard,
                now,
                interval_ms=self.hub.settings.heartbeat_interval_ms,
                stale_beats=self.hub.settings.stale_beats,
            )
        ]
        for pid in stale:
            log.warning(
                "peer %s missed %d heartbeats; marked disconnected", pid, self.hub.settings.stale_beats
            )
            await self.hub.close_sessions(pid, CLOSE_NORMAL, "stale: missed heartbeats")
        return stale

    async def stale_loop(self) -> None:
        """`check_stale` every half heartbeat interval (both ends)."""
        while True:
            await asyncio.sleep(self.hub.settings.heartbeat_interval_ms / 2000)
            try:
                await self.check_stale()
            except Exception:
                log.exception("stale-peer check failed")

    async def check_revocations(self) -> list[str]:
        """Backstop: close live sessions whose credential row was revoked; their peer ids."""
        if self.hub.db is None:
            return []
        by_credential = {s.credential_id: pid for pid, s in self.hub.sessions.items() if s.credential_id}
        async with self.hub.db.read() as conn:
            revoked = await store.revoked_among(conn, list(by_credential))
        closed = [by_credential[c] for c in revoked]
        for pid in closed:
            await self.hub.close_sessions(pid, CLOSE_REVOKED, "credential revoked")
        return closed

    async def revocation_loop(self) -> None:
        """`check_revocations` every revocation-check interval (coordinators)."""
        while True:
            await asyncio.sleep(self.hub.settings.revocation_check_ms / 1000)
            try:
                await self.check_revocations()
            except Exception as exc:
                log.warning("revocation re-check failed: %s", exc)

    async def discover_siblings(self) -> None:
        """Know every coordinator row; dial live ones with a higher instance id (one socket per pair)."""
        from conveyor.runtime import store as runtime_store

        assert self.hub.db is not None
        forgets_seen = self.hub.registry.forgets  # a row read before a forget must not bring the peer back
        async with self.hub.db.read() as conn:
            rows = await runtime_store.list_instances(conn)
            now = await runtime_store.database_now(conn)
        window_s = self.hub.settings.heartbeat_interval_ms * self.hub.settings.stale_beats / 1000
        me = self.hub.identity.instance_id
        for row in rows:
            if row.role != "coordinator" or row.instance_id == me:
                continue
            self.hub.registry.seed(row.instance_id, "coordinator", forgets_seen=forgets_seen)
            live = (now - row.last_heartbeat_at).total_seconds() <= window_s
            if live and row.instance_id > me and row.advertise_url:
                self.hub.dial(row.instance_id, row.advertise_url)

    async def discovery_loop(self) -> None:
        """`discover_siblings` every heartbeat interval (coordinators)."""
        while True:
            await asyncio.sleep(self.hub.settings.heartbeat_interval_ms / 1000)
            try:
                await self.discover_siblings()
            except Exception as exc:
                log.warning("sibling discovery failed: %s", exc)
