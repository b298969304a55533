"""Cluster and org settings (docs/design/cluster.md §5–§6): validating a change, resolving a value, caching
reads.

The decisions (what a PATCH changes, which layer a value comes from, how a reported version
compares) are pure functions. `SettingsResolver` is the one service every coordinator reads knobs
through: a whole-row cache of `cluster_settings` and a per-org cache of `org_settings`, both with a
short TTL, that keep the last good row when the database cannot be read.
"""

from __future__ import annotations

import asyncio
import difflib
import logging
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Generic, Literal, TypeVar

from conveyor.db.engine import Database
from conveyor.errors import ConveyorError
from conveyor.model.knobs import CLUSTER_KNOBS_BY_NAME, ORG_KNOBS_BY_NAME, Knob
from conveyor.runtime import store
from conveyor.runtime.store import StoredSettings

log = logging.getLogger(__name__)

Values = Mapping[str, int | None]
SettingsVersionStatus = Literal["in-sync", "behind", "ahead"]
T = TypeVar("T")

# The one pair whose effective values must be ordered (docs/design/cluster.md §5.2 `invalid_combination`).
BACKOFF_BASE = "scaler_provision_backoff_base_ms"
BACKOFF_MAX = "scaler_provision_backoff_max_ms"


# docs/design/global_workflows.md §1: the one org setting that is not an integer knob.
GLOBAL_SOURCES = "global_sources"
_ROUTING_KEY_SHAPE = re.compile(r"[a-z][a-z0-9_-]*:\S+")


class SettingsRejected(ConveyorError):
    """A settings change that must not be written; `code` is the API error code (HTTP 400)."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail


@dataclass(frozen=True)
class SettingsChange:
    """The outcome of a valid PATCH: every stored value after it, and which keys really changed."""

    values: dict[str, int | None]
    changed: list[str]

    @property
    def bumps_version(self) -> bool:
        """A version bump is due only when some value actually changed."""
        return bool(self.changed)


def nearest_setting(name: str, known: Mapping[str, Knob]) -> str | None:
    """The valid key closest to a misspelt one (`reroute_max_hop` → `reroute_max_hops`)."""
    close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.5)
    return close[0] if close else None


def effective_values(stored: Values, defaults: Values, knobs: Mapping[str, Knob]) -> dict[str, int | None]:
    """Each knob's stored value, or its configured default where the stored one is NULL."""
    return {name: _first_set(stored.get(name), defaults.get(name)) for name in knobs}


def plan_settings_change(
    body: Mapping[str, object], stored: Values, *, knobs: Mapping[str, Knob], defaults: Values
) -> SettingsChange:
    """Merge a PATCH body (`{key: int | null}`) over the stored values, or raise `SettingsRejected`.

    Checks run over the whole body before anything is decided, in the order an operator fixes
    them: unknown keys, then non-integers, then ranges, then the effective backoff pair.
    """
    for name in body:
        if name not in knobs:
            near = nearest_setting(name, knobs)
            hint = f"; did you mean {near}?" if near else ""
            raise SettingsRejected("unknown_setting", f"unknown setting {name!r}{hint}")
    for name, value in body.items():
        # bool is an int subclass in Python, but `true` is not a number of milliseconds.
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise SettingsRejected(
                "invalid_value", f"{name} must be an integer or null, got {_json_kind(value)}"
            )
    for name, value in body.items():
        knob = knobs[name]
        if isinstance(value, int) and not knob.minimum <= value <= knob.maximum:
            raise SettingsRejected("out_of_range", f"{knob.describe_range()}, got {value}")
    merged: dict[str, int | None] = {name: stored.get(name) for name in knobs}
    merged.update({name: value for name, value in body.items() if value is None or isinstance(value, int)})
    if BACKOFF_BASE in knobs and BACKOFF_MAX in knobs:
        effective = effective_values(merged, defaults, knobs)
        base, maximum = effective[BACKOFF_BASE], effective[BACKOFF_MAX]
        if base is not None and maximum is not None and base > maximum:
            raise SettingsRejected(
                "invalid_combination",
                f"effective {BACKOFF_BASE} ({base}) must not exceed {BACKOFF_MAX} ({maximum})",
            )
    changed = [name for name in knobs if merged[name] != stored.get(name)]
    return SettingsChange(values=merged, changed=changed)


def parse_global_sources(value: object) -> tuple[str, ...]:
    """A PATCH's `global_sources` (a list of routing keys, one comma-separated string, or null) → the keys,
    deduplicated in their given order; raises `SettingsRejected` (docs/design/global_workflows.md §1)."""
    if value is None:
        return ()
    if isinstance(value, str):
        items: list[object] = [part.strip() for part in value.split(",")]
    elif isinstance(value, list):
        items = list(value)
    else:
        raise SettingsRejected(
            "invalid_value", f"{GLOBAL_SOURCES} must be a list of routing keys, got {_json_kind(value)}"
        )
    keys: list[str] = []
    for item in items:
        if item == "":
            continue
        if not isinstance(item, str) or not _ROUTING_KEY_SHAPE.fullmatch(item):
            raise SettingsRejected(
                "invalid_value", f"{GLOBAL_SOURCES}: {item!r} is not a routing key (<kind>:<name>)"
            )
        if item not in keys:
            keys.append(item)
    return tuple(keys)


def resolve_setting(name: str, *, org: Values | None, cluster: Values | None, defaults: Values) -> int | None:
    """One knob's value by precedence: org override > cluster row > env/YAML default > built-in.

    `defaults` already folds the env/YAML default over the built-in one (`Settings.knob_default`).
    The org layer applies only to org knobs, the cluster layer only to cluster knobs.
    """
    if org is not None and name in ORG_KNOBS_BY_NAME and org.get(name) is not None:
        return org[name]
    if cluster is not None and name in CLUSTER_KNOBS_BY_NAME and cluster.get(name) is not None:
        return cluster[name]
    if name not in CLUSTER_KNOBS_BY_NAME and name not in ORG_KNOBS_BY_NAME:
        raise KeyError(f"unknown setting {name!r}")
    return defaults.get(name)


def classify_settings_version(applied: int, current: int) -> SettingsVersionStatus:
    """How a node's applied settings version compares with the row's (propagation report)."""
    if applied == current:
        return "in-sync"
    return "behind" if applied < current else "ahead"


def _first_set(*values: int | None) -> int | None:
    return next((v for v in values if v is not None), None)


def _json_kind(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, float):
        return "a number with a fraction"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


# --- reads through a cache


@dataclass(frozen=True)
class ClusterSettingsView:
    """One read of `cluster_settings`: version, stored values (None = unset) and effective values."""

    version: int
    stored: Mapping[str, int | None]
    effective: Mapping[str, int | None]
    updated_at: datetime | None = None
    updated_by: str | None = None

    def value(self, name: str) -> int | None:
        """A cluster knob's effective value."""
        return self.effective[name]


@dataclass(frozen=True)
class OrgSettingsView:
    """One read of an org's row: its overrides (None = inherit) and whether the row exists."""

    org_id: str
    version: int
    stored: Mapping[str, int | None]
    exists: bool
    updated_at: datetime | None = None
    updated_by: str | None = None
    global_sources: tuple[str, ...] = ()


def cluster_view(row: StoredSettings | None, defaults: Values) -> ClusterSettingsView:
    """The view of a (possibly missing) `cluster_settings` row; a missing row is version 0, all unset."""
    stored = dict(row.values) if row else dict.fromkeys(CLUSTER_KNOBS_BY_NAME)
    return ClusterSettingsView(
        version=row.version if row else 0,
        stored=stored,
        effective=effective_values(stored, defaults, CLUSTER_KNOBS_BY_NAME),
        updated_at=row.updated_at if row else None,
        updated_by=row.updated_by if row else None,
    )


def org_view(org_id: str, row: StoredSettings | None) -> OrgSettingsView:
    """The view of an org's (possibly missing) row."""
    return OrgSettingsView(
        org_id=org_id,
        version=row.version if row else 0,
        stored=dict(row.values) if row else dict.fromkeys(ORG_KNOBS_BY_NAME),
        exists=row is not None,
        updated_at=row.updated_at if row else None,
        updated_by=row.updated_by if row else None,
        global_sources=row.global_sources if row else (),
    )


def org_effective(
    org: OrgSettingsView, cluster: ClusterSettingsView, defaults: Values
) -> dict[str, int | None]:
    """Every org knob's effective value for this org (org > cluster > default)."""
    return {
        name: resolve_setting(name, org=org.stored, cluster=cluster.stored, defaults=defaults)
        for name in ORG_KNOBS_BY_NAME
    }


@dataclass
class _Cached(Generic[T]):
    value: T
    read_at: float


@dataclass
class SettingsResolver:
    """Reads cluster and org knobs through short caches (docs/design/cluster.md §5.2, §6).

    A cached row is reused for `cache_ttl_ms`; the writer calls `forget_cluster`/`forget_org` so its
    own next read sees the change at once. When a read fails the last good row is kept (defaults
    when there is none) and `on_read_error` is called (it counts
    `conveyor_cluster_settings_read_errors_total`).
    """

    db: Database
    defaults: Mapping[str, int | None]
    cache_ttl_ms: int
    clock: Callable[[], float] = time.monotonic
    on_read_error: Callable[[], None] = lambda: None
    _cluster: _Cached[ClusterSettingsView] | None = None
    _orgs: dict[str, _Cached[OrgSettingsView]] = field(default_factory=dict)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # Bumped by `forget_*`: a read that was in flight across a forget may predate the write, so its row
    # is kept only as the last good one, never served as fresh.
    _cluster_generation: int = 0
    _org_generations: dict[str, int] = field(default_factory=dict)

    @property
    def served_version(self) -> int:
        """The `cluster_settings` version the cache currently serves (0 before the first read)."""
        return self._cluster.value.version if self._cluster else 0

    def _fresh(self, entry: _Cached[T] | None) -> T | None:
        """The cached value while it is younger than the TTL, else None."""
        if entry is not None and self.clock() - entry.read_at < self.cache_ttl_ms / 1000:
            return entry.value
        return None

    async def cluster(self) -> ClusterSettingsView:
        """The cluster row through the cache."""
        cached = self._fresh(self._cluster)
        if cached is not None:
            return cached
        async with self._lock:  # one refresh at a time; the others reuse its result
            cached = self._fresh(self._cluster)
            if cached is not None:
                return cached
            generation = self._cluster_generation
            try:
                view = await self.read_cluster_uncached()
            except Exception as exc:
                self.on_read_error()
                log.warning("cluster settings read failed, serving the last good row: %s", exc)
                if self._cluster is not None:
                    return self._cluster.value
                return cluster_view(None, self.defaults)
            self._cluster = _Cached(view, self._read_at(generation == self._cluster_generation))
            return view

    def _read_at(self, still_current: bool) -> float:
        return self.clock() if still_current else float("-inf")

    async def read_cluster_uncached(self) -> ClusterSettingsView:
        """The cluster row straight from the database (GET route, worker snapshots)."""
        async with self.db.read() as conn:
            row = await store.read_cluster_settings(conn)
        return cluster_view(row, self.defaults)

    async def cluster_value(self, name: str) -> int | None:
        """A cluster knob's effective value."""
        return (await self.cluster()).value(name)

    async def org(self, org_id: str) -> OrgSettingsView:
        """An org's overrides through the cache."""
        entry = self._orgs.get(org_id)
        cached = self._fresh(entry)
        if cached is not None:
            return cached
        generation = self._org_generations.get(org_id, 0)
        try:
            async with self.db.read() as conn:
                view = org_view(org_id, await store.read_org_settings(conn, org_id))
        except Exception as exc:
            self.on_read_error()
            log.warning("org settings read failed for %s, serving the last good row: %s", org_id, exc)
            return entry.value if entry else org_view(org_id, None)
        self._orgs[org_id] = _Cached(view, self._read_at(generation == self._org_generations.get(org_id, 0)))
        return view

    async def org_value(self, org_id: str, name: str) -> int | None:
        """A knob's value for an org: org override > cluster row > env/YAML default > built-in."""
        org = await self.org(org_id) if name in ORG_KNOBS_BY_NAME else None
        cluster = await self.cluster() if name in CLUSTER_KNOBS_BY_NAME else None
        return resolve_setting(
            name,
            org=org.stored if org else None,
            cluster=cluster.stored if cluster else None,
            defaults=self.defaults,
        )

    async def global_sources(self, org_id: str) -> tuple[str, ...]:
        """The org's policy sources through the cache (docs/design/global_workflows.md §1)."""
        return (await self.org(org_id)).global_sources

    def forget_cluster(self) -> None:
        """Make the next cluster read go to the database (the writer's own next read sees its change).

        The row itself is kept as the last good one, for `served_version` and for read errors.
        """
        self._cluster_generation += 1
        if self._cluster is not None:
            self._cluster.read_at = float("-inf")

    def forget_org(self, org_id: str) -> None:
        """Make the next read of this org's row go to the database."""
        self._org_generations[org_id] = self._org_generations.get(org_id, 0) + 1
        entry = self._orgs.get(org_id)
        if entry is not None:
            entry.read_at = float("-inf")
