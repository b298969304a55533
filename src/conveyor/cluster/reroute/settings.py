"""The per-job reroute knobs (docs/design/cluster.md §4.2) and how an org's values are resolved."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class RerouteSettings:
    """Per-job reroute knobs, resolved when the offer is made (org > cluster > env default)."""

    ack_timeout_ms: int = 15_000
    max_hops: int = 3
    spawn_window_ms: int = 90_000
    spawn_max_attempts: int = 3
    spawn_retry_backoff_ms: int = 5_000


async def resolve_reroute_settings(
    org_id: str, org_value: Callable[[str, str], Awaitable[int | None]]
) -> RerouteSettings:
    """An org's per-job reroute knobs (docs/design/cluster.md §4.2): its `org_settings` column, else the
    `cluster_settings` column, else the env/YAML default (`org_value` is `SettingsResolver.org_value`); a knob
    with no value at all keeps the built-in default."""
    built_in = RerouteSettings()

    async def knob(name: str, fallback: int) -> int:
        value = await org_value(org_id, name)
        return int(value) if value is not None else fallback

    return RerouteSettings(
        ack_timeout_ms=await knob("reroute_ack_timeout_ms", built_in.ack_timeout_ms),
        max_hops=await knob("reroute_max_hops", built_in.max_hops),
        spawn_window_ms=await knob("reroute_spawn_window_ms", built_in.spawn_window_ms),
        spawn_max_attempts=await knob("reroute_spawn_max_attempts", built_in.spawn_max_attempts),
        spawn_retry_backoff_ms=await knob("reroute_spawn_retry_backoff_ms", built_in.spawn_retry_backoff_ms),
    )
