"""Instance identity and the `cluster_instances` heartbeat (docs/design/cluster.md §1).

A node's `instance_id` is stable across restarts (configured, or generated once into
`$CONVEYOR_HOME/instance-id`); its `boot_id` changes with every process start, which is how a
restarted node tells its own crashed predecessor's row from a second live process with the same id.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Literal

from conveyor.db.engine import Database
from conveyor.errors import ConveyorError
from conveyor.model.ids import stored_id
from conveyor.runtime import store
from conveyor.runtime.store import InstanceRow

log = logging.getLogger(__name__)

INSTANCE_ID_FILE = "instance-id"


class BootRefused(ConveyorError):
    """This node must not run next to what the `cluster_instances` rows show (the message says why)."""


@dataclass(frozen=True)
class Identity:
    """Who this process is in the cluster."""

    instance_id: str
    boot_id: str
    role: str
    advertise_url: str | None
    software_version: str


def load_instance_id(home: Path, configured: str | None) -> str:
    """The configured instance id, else the one stored in `$CONVEYOR_HOME/instance-id` (made once)."""
    return stored_id(home / INSTANCE_ID_FILE, configured)


def default_advertise_url(port: int) -> str:
    """`http://<hostname>:<port>`, the URL siblings dial when none is configured."""
    return f"http://{socket.gethostname()}:{port}"


def stale_window(heartbeat_interval_ms: int, stale_beats: int) -> timedelta:
    """How long a row stays live without a heartbeat."""
    return timedelta(milliseconds=heartbeat_interval_ms * stale_beats)


def is_live(row: InstanceRow, now: datetime, window: timedelta) -> bool:
    """Whether the row's last heartbeat is within the stale window."""
    return now - row.last_heartbeat_at <= window


BootVerdict = Literal["go", "wait"]


def judge_boot(
    rows: list[InstanceRow], *, me: Identity, dialect: str, now: datetime, window: timedelta
) -> tuple[BootVerdict, str]:
    """May this process start next to these rows? ("go" | "wait", reason).

    Another live process with our instance id (another boot id) may be a crashed predecessor whose
    row has not gone stale yet, so the caller waits up to one stale window before refusing. On SQLite
    any other live coordinator is refused the same way: one file supports one coordinator.
    """
    for row in rows:
        if row.boot_id == me.boot_id or not is_live(row, now, window):
            continue
        if dialect == "sqlite" and row.role == "coordinator" and me.role == "coordinator":
            return "wait", "SQLite supports one coordinator; use PostgreSQL"
        if row.instance_id == me.instance_id:
            return "wait", (
                f"duplicate instance_id {me.instance_id}: another process with this id is beating "
                f"(boot {row.boot_id}); give each node its own CONVEYOR_HOME or CONVEYOR_INSTANCE_ID"
            )
    return "go", ""


async def _no_settings_version() -> int:
    return 0


@dataclass
class InstanceHeartbeat:
    """Upserts this node's `cluster_instances` row every interval; deletes it on clean shutdown."""

    db: Database
    identity: Identity
    interval_ms: int
    # The settings version this node's reads serve (refreshing the cache if it is due).
    applied_settings_version: Callable[[], Awaitable[int]] = field(default=_no_settings_version)
    draining: Callable[[], bool] = lambda: False
    started_at: datetime | None = None
    last_beat_at: datetime | None = None
    _task: asyncio.Task[None] | None = field(default=None, repr=False)

    async def check_boot(
        self,
        *,
        window: timedelta,
        dialect: str,
        poll_s: float = 0.1,
        predecessor_crashed: bool = False,
        on_wait: Callable[[str], None] | None = None,
    ) -> None:
        """Wait up to one stale window for conflicting rows to go stale; raise `BootRefused` if not.

        `predecessor_crashed`: this process holds its home's lock and uses the home's own SQLite file, so
        no other live process can be using it; a conflicting row is a crashed predecessor's: no wait.
        `on_wait(reason)` is called once, when the first look finds a conflict worth waiting for.
        """
        deadline = time.monotonic() + window.total_seconds()
        told = False
        while True:
            async with self.db.read() as conn:
                rows = await store.list_instances(conn)
                now = await store.database_now(conn)
            verdict, reason = judge_boot(rows, me=self.identity, dialect=dialect, now=now, window=window)
            if verdict == "go":
                return
            if predecessor_crashed:
                log.info(
                    "a crashed predecessor's instance row is still live; the home lock is free: %s", reason
                )
                return
            if time.monotonic() >= deadline:
                raise BootRefused(reason)
            if not told:  # once, not at every poll
                told = True
                log.warning("waiting for a conflicting instance row to go stale: %s", reason)
                if on_wait is not None:
                    on_wait(reason)
            await asyncio.sleep(poll_s)

    async def beat(self) -> None:
        """Write one heartbeat now."""
        applied_version = await self.applied_settings_version()
        async with self.db.transaction() as conn:
            if self.started_at is None:
                self.started_at = await store.database_now(conn)
            self.last_beat_at = await store.beat_instance(
                conn,
                instance_id=self.identity.instance_id,
                boot_id=self.identity.boot_id,
                role=self.identity.role,
                advertise_url=self.identity.advertise_url,
                software_version=self.identity.software_version,
                started_at=self.started_at,
                draining=self.draining(),
                applied_settings_version=applied_version,
            )

    async def start(self) -> None:
        """Write the first heartbeat, then keep beating in the background."""
        await self.beat()
        self._task = asyncio.create_task(self._loop(), name="instance-heartbeat")

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_ms / 1000)
            try:
                await self.beat()
            except Exception as exc:  # a missed beat is retried at the next interval
                log.warning("heartbeat failed: %s", exc)

    async def stop(self) -> None:
        """Stop beating and delete this process's row."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        try:
            async with self.db.transaction() as conn:
                await store.delete_instance(conn, self.identity.instance_id, self.identity.boot_id)
        except Exception as exc:
            log.warning("could not delete the instance row at shutdown: %s", exc)
