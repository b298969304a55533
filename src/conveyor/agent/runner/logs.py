"""Log buffering and step reporting: each step's lines masked and chunked (`StepLog`), held until the
step is reported started, flushed periodically and when it finishes."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from conveyor.agent.logs import StepLog
from conveyor.agent.runner.core import RunnerCore


class LogPart(RunnerCore):
    """The runner's logs and step reports."""

    def log(self, index: int, text: str, stream: str = "sys") -> None:
        """One line into a step's log (masked here, before it leaves the runner)."""
        self._add_line(index, self.masker.mask(text), stream)

    def _add_line(self, index: int, text: str, stream: str) -> None:
        step_log = self.logs.get(index)
        if step_log is None:
            step_log = self.logs[index] = StepLog(index, self.spec.log_max_bytes, clock=self.clock)
        for chunk in step_log.add(text, stream):
            self._send_chunk(chunk)

    def _send_chunk(self, chunk: dict[str, Any]) -> None:
        index = chunk["step_index"]
        if index in self.announced:
            self.emit("log", **chunk)
        else:
            # A step's lines (e.g. from its rules) wait until the step is reported started or finished.
            self.held.setdefault(index, []).append(chunk)

    def _release(self, index: int) -> None:
        for chunk in self.held.pop(index, []):
            self.emit("log", **chunk)

    async def _flush_logs_periodically(self) -> None:
        while True:
            await asyncio.sleep(0.05)
            for index, step_log in list(self.logs.items()):
                if index in self.announced and (chunk := step_log.due()):
                    self._send_chunk(chunk)

    def _flush_step_log(self, index: int) -> None:
        step_log = self.logs.get(index)
        if step_log is not None and (chunk := step_log.flush()):
            self._send_chunk(chunk)

    # -- step reporting -----------------------------------------------------------------------------

    def step_started(self, index: int, name: str, kind: str, lock_index: int | None) -> None:
        """Report a step as running (once)."""
        if index in self.announced:
            return
        self.announced.add(index)
        self.emit("step.started", step_index=index, name=name, kind=kind, lock_index=lock_index, ts=_now_ms())
        self._release(index)

    def step_finished(
        self,
        index: int,
        name: str,
        kind: str,
        lock_index: int | None,
        *,
        status: str,
        reason: str | None = None,
        error: str | None = None,
        exit_code: int | None = None,
        outputs: dict[str, Any] | None = None,
        attempts: int = 0,
        duration_ms: int = 0,
    ) -> None:
        """Send the step's remaining log, then its terminal status."""
        self.announced.add(index)
        self._release(index)
        self._flush_step_log(index)
        self.emit(
            "step.finished",
            step_index=index,
            name=name,
            kind=kind,
            lock_index=lock_index,
            status=status,
            reason=reason,
            exit_code=exit_code,
            # Masked as it leaves the runner; later steps of this job still see the values (`self.records`).
            outputs=None if outputs is None else self.masker.mask_json(outputs),
            attempts=attempts,
            duration_ms=duration_ms,
            error=None if error is None else self.masker.mask(error),
        )


def _now_ms() -> int:
    return int(time.time() * 1000)
