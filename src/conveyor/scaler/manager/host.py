"""What this node's backends leave on the host (docs/design/scaler.md §3): the dead-item sweeps of backends
that have one, at boot the live items of an older boot of this node, ended with their spawn rows, and the
teardowns that failed, tried again on their own schedule.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from functools import partial

from conveyor.scaler.backend import LiveItem, ScalerBackend
from conveyor.scaler.manager.core import ManagerCore, Reattempt
from conveyor.scaler.manager.reattempts import FailedTeardown, due_teardowns

log = logging.getLogger(__name__)


class HostPart(ManagerCore):
    """Sweeps, leftovers and teardown reattempts of this node's backends."""

    # --- teardown reattempts (docs/design/scaler.md §3, "Teardown reattempts")

    def teardown_failed(self, key: str, what: str, retry: Callable[[], Awaitable[None]], error: str) -> None:
        """A teardown raised: remember it, to try it again every `scaler_reap_reattempt_interval_ms`."""
        known = self.failed_teardowns.get(key)
        attempts = known.state.attempts + 1 if known is not None else 1
        self.failed_teardowns[key] = Reattempt(FailedTeardown(key, attempts, self.clock()), what, retry)
        log.warning(
            "teardown of %s failed (attempt %d), tried again every scaler_reap_reattempt_interval_ms: %s",
            what,
            attempts,
            error,
        )

    async def reattempt_teardowns(self) -> None:
        """Start each failed teardown that is due (every round; each runs as a teardown task)."""
        if not self.failed_teardowns:
            return
        interval_ms = await self.knob("scaler_reap_reattempt_interval_ms", None)
        states = [reattempt.state for reattempt in self.failed_teardowns.values()]
        for key in due_teardowns(states, now=self.clock(), interval_ms=interval_ms):
            reattempt = self.failed_teardowns[key]
            reattempt.state = dataclasses.replace(reattempt.state, in_flight=True)
            self._spawn_task(self._reattempt(reattempt), f"scaler-reattempt-{key}", teardown=True)

    async def _reattempt(self, reattempt: Reattempt) -> None:
        key = reattempt.state.key
        try:
            await reattempt.retry()
        except Exception as exc:
            self.teardown_failed(key, reattempt.what, reattempt.retry, str(exc) or type(exc).__name__)
            return
        self.failed_teardowns.pop(key, None)
        log.info("teardown of %s succeeded at attempt %d", reattempt.what, reattempt.state.attempts + 1)

    # --- dead-item sweeps

    async def sweep_backends(self) -> None:
        """Backends with a dead-item sweep (firecracker: TAPs, addresses, directories) run it (boot, 15 min)."""
        self._last_sweep = time.monotonic()
        for runtime in list(self.scalers.values()):
            sweep = getattr(runtime.backend, "sweep", None)
            if not callable(sweep):
                continue
            try:
                report = await sweep()
            except Exception as exc:
                log.warning("scaler %s: dead-item sweep failed: %s", runtime.entry.name, exc)
                continue
            log.info("scaler %s: dead-item sweep: %s", runtime.entry.name, report)

    # --- restart

    async def live_items(self) -> list[tuple[ScalerBackend | None, LiveItem]]:
        """Everything live on this host of every backend type this node knows (one listing per type)."""
        from conveyor.scaler.bare_metal import list_records

        seen: set[str] = set()
        items: list[tuple[ScalerBackend | None, LiveItem]] = []
        for runtime in self.scalers.values():
            if runtime.entry.type in seen:
                continue
            seen.add(runtime.entry.type)
            try:
                for item in await runtime.backend.list_live():
                    items.append((runtime.backend, item))
            except Exception:
                log.exception("listing live items of scaler %s failed", runtime.entry.name)
        if "bare-metal" not in seen:
            items.extend((None, item) for item in list_records(self.context.home / "scaler" / "bare-metal"))
        return items

    async def stop_item(self, backend: ScalerBackend | None, item: LiveItem) -> None:
        """End one live item through its backend (bare-metal records also without one)."""
        if backend is not None:
            await backend.stop_live(item)
            return
        from conveyor.scaler.bare_metal import DEFAULT_TERMINATE_GRACE_S, stop_recorded

        base = self.context.home / "scaler"
        await stop_recorded(base / "bare-metal", base / "work", item, DEFAULT_TERMINATE_GRACE_S)

    async def end_leftovers(self) -> list[str]:
        """At boot: end live items stamped with this node and an older boot; close their spawn rows."""
        ended: list[str] = []
        for backend, item in await self.live_items():
            if item.node_marker != self.context.node_id or item.boot_marker == self.context.boot_id:
                continue
            try:
                await self.stop_item(backend, item)
            except Exception as exc:
                self.teardown_failed(
                    item.vm_id,
                    f"leftover {item.kind} {item.vm_id}",
                    partial(self.stop_item, backend, item),
                    str(exc) or type(exc).__name__,
                )
                continue
            ended.append(item.vm_id)
            log.warning(
                "ended leftover agent %s (%s %s, pid %s) of an older boot %s of this node",
                item.vm_id,
                item.backend,
                item.kind,
                item.pid,
                item.boot_marker,
                extra={"agent_id": item.agent_id, "boot_marker": item.boot_marker},
            )
        await self.records.end_leftovers(self.context.node_id, self.context.boot_id)
        return ended
