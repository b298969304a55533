"""The job: setup, then its steps with their rules, timeouts and retries, then its hooks; `job.finished`
always last."""

from __future__ import annotations

import asyncio
from typing import Any

from conveyor.agent.runner.child import ChildPart
from conveyor.agent.runner.core import ChildOutcome, SetupFailed, StepRecord
from conveyor.agent.runner.logs import LogPart
from conveyor.agent.runner.policy import (
    DEFAULT_HOOK_TIMEOUT_MS,
    DEFAULT_STEP_TIMEOUT_MS,
    HOOK_ORDER,
    aggregate_status,
    retry_delay_ms,
)
from conveyor.agent.runner.setup import SetupPart
from conveyor.agent.spec import HOOKS_JOB_NAME
from conveyor.lockfile.models import StepEntry


class Runner(LogPart, ChildPart, SetupPart):
    """Runs one job: setup (checkout, requirements, drift, rules), steps, hooks; reports everything.

    State is `core.RunnerCore`'s; logs, step processes and setup are each one part (`logs.py`, `child.py`,
    `setup.py`).
    """

    async def run_step(self, entry: StepEntry, lock_index: int) -> StepRecord:
        """One step with its rules, timeout and retries; reports it and returns its record."""
        index = self.next_index
        self.next_index += 1
        retry = entry.retry
        max_attempts = retry.max_attempts if retry is not None else 1
        started = self.clock()
        attempt = 0
        outcome = ChildOutcome(status="failed")
        while True:
            attempt += 1
            if attempt > 1:
                self.log(index, f"attempt {attempt}/{max_attempts}")
            message = self._base_message("step", entry.name, attempt)
            message["evaluate_rules"] = attempt == 1
            outcome = await self.run_child(
                index,
                message,
                timeout_ms=entry.timeout_ms or DEFAULT_STEP_TIMEOUT_MS,
                on_begin=lambda: self.step_started(index, entry.name, "step", lock_index),
            )
            if outcome.status in ("success", "skipped", "cancelled") or outcome.reason == "job_timeout":
                break
            if outcome.error:
                self.log(index, f"attempt {attempt} failed: {outcome.error}")
            if attempt >= max_attempts or not outcome.retry or retry is None or self.cancel is not None:
                break
            if not await self._sleep_unless_stopped(retry_delay_ms(retry, attempt) / 1000):
                outcome = ChildOutcome(status="cancelled", reason="cancelled", error="cancelled", retry=False)
                break
        record = StepRecord(entry.name, outcome.status, outcome.outputs, outcome.reason)
        self.records[entry.name] = record
        self.step_finished(
            index,
            entry.name,
            "step",
            lock_index,
            status=outcome.status,
            reason=outcome.reason if outcome.status != "success" else None,
            error=outcome.error if outcome.status != "success" else None,
            exit_code=outcome.exit_code,
            outputs=outcome.outputs if outcome.status == "success" else None,
            attempts=attempt if outcome.status != "skipped" else 0,
            duration_ms=int((self.clock() - started) * 1000),
        )
        return record

    async def _sleep_unless_stopped(self, seconds: float) -> bool:
        deadline = self.clock() + seconds
        while self.clock() < deadline:
            if self.cancel is not None or self.job_timed_out:
                return False
            await asyncio.sleep(min(0.05, max(deadline - self.clock(), 0)))
        return True

    def skip_step(self, entry: StepEntry, lock_index: int, reason: str) -> None:
        """Report a step that will not run."""
        index = self.next_index
        self.next_index += 1
        self.records[entry.name] = StepRecord(entry.name, "skipped", None, reason)
        self.step_finished(index, entry.name, "step", lock_index, status="skipped", reason=reason)

    async def run_hook(self, kind: str, owner: str, timeout_ms: int, outcome: dict[str, Any]) -> ChildOutcome:
        """One hook as a `hook` pseudo-step."""
        index = self.next_index
        self.next_index += 1
        started = self.clock()
        message = self._base_message("hook", kind)
        message.update({"hook": kind, "owner": owner})
        message["ctx"]["outcome"] = outcome
        result = await self.run_child(
            index,
            message,
            timeout_ms=timeout_ms,
            on_begin=lambda: self.step_started(index, kind, "hook", None),
        )
        self.step_started(index, kind, "hook", None)
        self.step_finished(
            index,
            kind,
            "hook",
            None,
            status=result.status,
            reason=result.reason if result.status != "success" else None,
            error=result.error if result.status != "success" else None,
            exit_code=result.exit_code,
            attempts=1,
            duration_ms=int((self.clock() - started) * 1000),
        )
        return result

    async def run(self) -> None:
        """The whole job; always ends with `job.finished`."""
        spec = self.spec
        flusher = asyncio.create_task(self._flush_logs_periodically())
        deadline = asyncio.create_task(self._watch_job_deadline())
        status, reason, error = "success", None, None
        failed_step: str | None = None
        self.step_started(0, "setup", "setup", None)
        setup_started = self.clock()
        hooks: dict[str, int] = {}
        try:
            verdict, hooks = await self.setup()
        except SetupFailed as failure:
            verdict = "failed"
            status, reason, error = "failed", failure.reason, failure.error
            if failure.reason in ("cancelled", "job_timeout", "step_timeout"):
                status = "cancelled" if failure.reason == "cancelled" else "timed_out"
                reason = "job_timeout" if status == "timed_out" else reason
            self.log(0, error)
        except Exception as problem:  # the runner must always finish the job it was given
            verdict = "failed"
            status, reason, error = "failed", "runner_crashed", f"setup crashed: {problem!r}"
            self.log(0, error)
        self.step_finished(
            0,
            "setup",
            "setup",
            None,
            status="success" if verdict != "failed" else status,
            reason=reason,
            error=error,
            attempts=1,
            duration_ms=int((self.clock() - setup_started) * 1000),
        )
        steps = list(enumerate(spec.job.steps))
        if verdict != "passed":
            if verdict == "skipped":
                status, reason = "skipped", "rules"
            for lock_index, entry in steps:
                self.skip_step(entry, lock_index, reason or "skipped")
        else:
            for position, (lock_index, entry) in enumerate(steps):
                if self.cancel is not None or self.job_timed_out:
                    for later_index, later in steps[position:]:
                        self.skip_step(later, later_index, "cancelled" if self.cancel else "job_timeout")
                    break
                record = await self.run_step(entry, lock_index)
                if record.status in ("success", "skipped"):
                    continue
                if record.status == "cancelled":
                    status, reason, failed_step = "cancelled", self.cancel_reason or "cancelled", entry.name
                elif record.reason == "job_timeout" or self.job_timed_out:
                    status, reason, failed_step = "timed_out", "job_timeout", entry.name
                elif entry.continue_on_error and record.status in ("failed", "timed_out"):
                    self.log(lock_index + 1, f"step {entry.name!r} {record.status}; continue_on_error is set")
                    continue
                elif record.status == "timed_out":
                    status, reason, failed_step = "timed_out", f"step_timeout: {entry.name}", entry.name
                else:
                    code = (
                        record.reason
                        if record.reason in ("outputs_invalid", "outputs_too_large")
                        else "step_failed"
                    )
                    status, reason, failed_step = "failed", f"{code}: {entry.name}", entry.name
                for later_index, later in steps[position + 1 :]:
                    self.skip_step(later, later_index, "skipped")
                break
            else:
                if self.job_timed_out and status == "success":
                    status, reason = "timed_out", "job_timeout"
        if self.cancel is not None and status in ("success", "skipped"):
            status, reason = "cancelled", self.cancel_reason or "cancelled"
        deadline.cancel()
        if verdict != "skipped" and not (self.cancel is not None and self.cancel.kind == "force"):
            status, reason, error = await self._run_hooks(status, reason, error, failed_step, hooks)
        outputs = {
            name: record.outputs
            for name, record in self.records.items()
            if record.status == "success" and record.outputs
        }
        self.kill_leftovers()
        await self.remove_containers()
        flusher.cancel()
        for index in list(self.logs):
            self._flush_step_log(index)
        self.emit(
            "job.finished",
            status=status,
            reason=reason,
            outputs=self.masker.mask_json(outputs),
            duration_ms=int((self.clock() - self.started) * 1000),
            error=None if error is None else self.masker.mask(error),
        )

    async def _run_hooks(
        self,
        status: str,
        reason: str | None,
        error: str | None,
        failed_step: str | None,
        workflow_hooks: dict[str, int],
    ) -> tuple[str, str | None, str | None]:
        spec = self.spec
        self.in_hooks = True
        if spec.job.name == HOOKS_JOB_NAME:
            owner = "workflow"
            timeouts = dict(workflow_hooks)
            decisive = aggregate_status([result.status for result in spec.upstream.values()])
        else:
            owner = "job"
            timeouts = {kind: hook.timeout_ms for kind, hook in spec.job.hooks.items()}
            decisive = status
        wanted = {
            "success": ("on_success",),
            "skipped": ("on_success",),
            "failed": ("on_failure",),
            "timed_out": ("on_failure",),
            "cancelled": ("on_cancel",),
        }.get(decisive, ())
        for kind in HOOK_ORDER:
            if kind not in timeouts or (kind != "cleanup" and kind not in wanted):
                continue
            if self.cancel is not None and self.cancel.kind == "force":
                break
            outcome = {
                "status": decisive,
                "reason": reason,
                "failed_step": failed_step,
                "duration_s": self.clock() - self.started,
            }
            result = await self.run_hook(kind, owner, timeouts[kind] or DEFAULT_HOOK_TIMEOUT_MS, outcome)
            if result.status != "success":
                if kind == "on_success":
                    status, reason, error = "failed", "step_failed: on_success", result.error
                else:
                    self.log(
                        self.next_index - 1, f"{kind} hook {result.status}; the job status stays {status}"
                    )
        return status, reason, error
