"""Carries out a fault schedule against the cluster on time, recording each episode's start and end."""

from __future__ import annotations

import heapq
import random
import threading
from collections.abc import Sequence

import psutil

from chaos.cluster import ChaosCluster
from chaos.recorder import Recorder
from chaos.schedule import Fault, FaultKind


class Injector:
    """Starts and ends the episodes of `schedule` from a background thread."""

    def __init__(
        self, cluster: ChaosCluster, schedule: Sequence[Fault], recorder: Recorder, seed: int
    ) -> None:
        self.cluster = cluster
        self.schedule = sorted(schedule, key=lambda f: f.at)
        self.recorder = recorder
        self.rng = random.Random(seed * 104729 + 3)
        self.done: list[Fault] = []
        self._active: list[tuple[float, int, Fault]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="injector")

    def start(self) -> None:
        """Begin on the schedule's clock (t = 0 is the recorder's start)."""
        self._thread.start()

    def stop(self) -> None:
        """Stop starting episodes and end those in force."""
        self._stop.set()
        self._thread.join(timeout=60)
        while self._active:
            _, _, fault = heapq.heappop(self._active)
            self._end(fault)

    def _run(self) -> None:
        pending = list(self.schedule)
        sequence = 0
        while not self._stop.is_set():
            next_start = pending[0].at if pending else float("inf")
            next_end = self._active[0][0] if self._active else float("inf")
            due = min(next_start, next_end)
            if due == float("inf"):
                return
            wait = due - self.recorder.now()
            if wait > 0 and self._stop.wait(min(wait, 1.0)):
                return
            if wait > 1.0:
                continue
            if next_end <= next_start:
                _, _, fault = heapq.heappop(self._active)
                self._end(fault)
            else:
                fault = pending.pop(0)
                if self._begin(fault):
                    sequence += 1
                    heapq.heappush(self._active, (fault.ends_at, sequence, fault))

    def _begin(self, fault: Fault) -> bool:
        cluster = self.cluster
        extra: dict[str, object] = {}
        try:
            if fault.kind is FaultKind.KILL:
                cluster.kill(fault.target)
            elif fault.kind is FaultKind.FREEZE:
                cluster.freeze(fault.target)
            elif fault.kind is FaultKind.LINK_CUT:
                cluster.cut(fault.target)
            elif fault.kind is FaultKind.PG_TERMINATE:
                extra["terminated"] = cluster.terminate_sessions(
                    float(fault.detail.get("share", 1.0)), self.rng
                )
            elif fault.kind is FaultKind.DISK_FULL:
                extra["bytes"] = cluster.fill_disk(fault.target)
            elif fault.kind is FaultKind.SPAWNED_KILL:
                agents = cluster.spawned_agents()
                if not agents:
                    self.recorder.record(
                        "fault", phase="skipped", why="no spawned agent alive", **fault.as_record()
                    )
                    return False
                victim = self.rng.choice(sorted(agents, key=lambda p: p.pid))
                extra["pid"] = victim.pid
                try:
                    victim.kill()
                except psutil.Error:
                    pass
        except Exception as exc:
            self.recorder.record("fault", phase="failed", error=repr(exc), **fault.as_record())
            return False
        self.done.append(fault)
        self.recorder.record("fault", phase="start", **extra, **fault.as_record())
        return True

    def _end(self, fault: Fault) -> None:
        cluster = self.cluster
        try:
            if fault.kind is FaultKind.KILL:
                cluster.restart(fault.target)
            elif fault.kind is FaultKind.FREEZE:
                cluster.thaw(fault.target)
            elif fault.kind is FaultKind.LINK_CUT:
                cluster.restore(fault.target)
            elif fault.kind is FaultKind.DISK_FULL:
                cluster.free_disk(fault.target)
        except Exception as exc:
            self.recorder.record("fault", phase="end-failed", error=repr(exc), **fault.as_record())
            return
        if fault.duration:
            self.recorder.record("fault", phase="end", kind=fault.kind.value, target=fault.target)
