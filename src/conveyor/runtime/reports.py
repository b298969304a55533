"""What operators see of the cluster: the settings propagation report and the cluster status.

Both are pure functions over rows read in one go, with `now` from the database clock that also
stamped the heartbeats, so ages never mix two clocks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from conveyor.model.ids import format_rfc3339
from conveyor.parts import PartKey
from conveyor.runtime.instances import is_live
from conveyor.runtime.settings import classify_settings_version
from conveyor.runtime.store import InstanceRow, LeaseRow


def _age_ms(now: datetime, then: datetime | None) -> int | None:
    return None if then is None else max(0, int((now - then).total_seconds() * 1000))


def _time(value: datetime | None) -> str | None:
    return None if value is None else format_rfc3339(value)


@dataclass(frozen=True)
class SelfReport:
    """This coordinator as it sees itself: the version its cache serves and its last heartbeat."""

    instance_id: str
    role: str
    served_version: int
    last_heartbeat_at: datetime | None


@dataclass(frozen=True)
class PeerVersion:
    """A peer as the peer registry knows it: the settings version of its last heartbeat."""

    instance_id: str
    role: str
    connected: bool
    applied_version: int
    last_heartbeat_at: datetime | None
    last_heartbeat_age_ms: int | None


PeerVersions = Callable[[], Sequence[PeerVersion]]


def propagation_report(
    *,
    current_version: int,
    me: SelfReport,
    rows: Sequence[InstanceRow],
    now: datetime,
    window: timedelta,
    peers: Sequence[PeerVersion] = (),
) -> dict[str, Any]:
    """`GET cluster-settings/propagation` (docs/design/cluster.md §5.3): this node first, then every known
    peer.

    Coordinators come from their `cluster_instances` rows: `connected` means the row is live and
    `applied_version` is the version the row last reported. Then every registry peer without a row
    (workers: they have no database) with the version of its last heartbeat; one never heard from
    reports version 0 and null heartbeat fields.
    """
    entries = [
        {
            "instance_id": me.instance_id,
            "role": me.role,
            "self": True,
            "connected": True,
            "applied_version": me.served_version,
            "status": classify_settings_version(me.served_version, current_version),
            "last_heartbeat_at": _time(me.last_heartbeat_at),
            "last_heartbeat_age_ms": _age_ms(now, me.last_heartbeat_at),
        }
    ]
    for row in rows:
        if row.instance_id == me.instance_id:
            continue
        entries.append(
            {
                "instance_id": row.instance_id,
                "role": row.role,
                "self": False,
                "connected": is_live(row, now, window),
                "applied_version": row.applied_settings_version,
                "status": classify_settings_version(row.applied_settings_version, current_version),
                "last_heartbeat_at": _time(row.last_heartbeat_at),
                "last_heartbeat_age_ms": _age_ms(now, row.last_heartbeat_at),
            }
        )
    listed = {entry["instance_id"] for entry in entries}
    for peer in peers:
        if peer.instance_id in listed:
            continue
        listed.add(peer.instance_id)
        entries.append(
            {
                "instance_id": peer.instance_id,
                "role": peer.role,
                "self": False,
                "connected": peer.connected,
                "applied_version": peer.applied_version,
                "status": classify_settings_version(peer.applied_version, current_version),
                "last_heartbeat_at": _time(peer.last_heartbeat_at),
                "last_heartbeat_age_ms": peer.last_heartbeat_age_ms,
            }
        )
    return {
        "current_version": current_version,
        "reported_by": me.instance_id,
        "generated_at": _time(now),
        "orchestrators": entries,
    }


def lease_report(lease: LeaseRow | None, now: datetime) -> dict[str, Any] | None:
    """The lease row as the API shows it, with whether it is live."""
    if lease is None:
        return None
    return {
        "holder": lease.holder,
        "epoch": lease.epoch,
        "acquired_at": _time(lease.acquired_at),
        "expires_at": _time(lease.expires_at),
        "live": lease.expires_at > now,
    }


def cluster_status(
    *,
    me: str,
    rows: Sequence[InstanceRow],
    lease: LeaseRow | None,
    now: datetime,
    window: timedelta,
) -> dict[str, Any]:
    """`GET cluster/status`: instances, roles, the leader, heartbeat ages, applied settings versions."""
    leader = lease.holder if lease is not None and lease.expires_at > now else None
    return {
        "instance_id": me,
        "generated_at": _time(now),
        "stale_window_ms": int(window.total_seconds() * 1000),
        "leader": leader,
        "lease": lease_report(lease, now),
        "instances": [
            {
                "instance_id": row.instance_id,
                "boot_id": row.boot_id,
                "role": row.role,
                "self": row.instance_id == me,
                "leader": row.instance_id == leader,
                "live": is_live(row, now, window),
                "draining": row.draining,
                "advertise_url": row.advertise_url,
                "software_version": row.software_version,
                "started_at": _time(row.started_at),
                "last_heartbeat_at": _time(row.last_heartbeat_at),
                "last_heartbeat_age_ms": _age_ms(now, row.last_heartbeat_at),
                "applied_settings_version": row.applied_settings_version,
            }
            for row in rows
        ],
    }


PEER_VERSIONS = PartKey[Callable[[], Sequence[PeerVersion]]]("settings_propagation_peers")
"""What the peer hub publishes (the cluster package sits above this one), so the report lists workers, which
have no instance row."""
