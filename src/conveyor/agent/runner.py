"""The job runner: `python -m conveyor.agent.runner (--workspace DIR | --wait) [--venvs DIR] [--mirrors DIR]`.

(docs/design/execution.md §7.) `--mirrors` (with `--mirror-max-bytes`) checks out through the agent's
per-repository mirrors (`mirror.py`); without it the runner fetches from the clone URL directly, as
`conveyor run local` does.

stdin: with `--wait` (a runner the agent starts before its job arrives), first `{"workspace", "venvs",
"mirrors", "mirror_max_bytes"}` (the last two may be absent); then
the job spec as one JSON line, then control lines `{"cancel": {"force": bool, "reason": str}}` and
`{"emit_result": {"request_id", "event_id", "error": {"code", "detail", "retry_after_ms"} | null}}`. stdout: JSON lines with a `type` — `proc`,
`step.started`, `log`, `step.finished`, `event.emit`, `job.finished` (always last). The runner never imports
user code: checkout, the drift check and the order of things happen here; rules, steps and hooks each run in
a step process (`conveyor.agent.step`) in its own process group; the next one is started while the
current one runs (`step_spare`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import json
import os
import re
import signal
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from conveyor.agent.checkout import CheckoutFailed, checkout, credential_values
from conveyor.agent.container_plan import (
    AGENT_ID_VARIABLE,
    ContainerFailed,
    JobContainer,
    engine_address,
    engine_may_answer,
    local_agent_id,
)
from conveyor.agent.context import DEFAULT_EMIT_TIMEOUT_S
from conveyor.agent.logs import StepLog
from conveyor.agent.mirror import DEFAULT_MAX_BYTES, Mirrors
from conveyor.agent.requirements import (
    RequirementsFailed,
    ensure_venv,
    remember_interpreter,
    requirement_lines,
    venv_python,
)
from conveyor.agent.shell import kill_grace_s
from conveyor.agent.signals import signal_group
from conveyor.agent.spec import HOOKS_JOB_NAME, JobSpec
from conveyor.agent.step_spare import StepSpares, spawn_step
from conveyor.errors import ConveyorError
from conveyor.heap import freeze_startup_heap
from conveyor.lockfile.hashing import content_hash_of_checkout
from conveyor.lockfile.models import StepEntry
from conveyor.model.masking import Masker, StreamMasker

DEFAULT_STEP_TIMEOUT_MS = 30 * 60 * 1000
DEFAULT_HOOK_TIMEOUT_MS = 5 * 60 * 1000
# Output still held open by a leftover background process after the step exited is read this long.
EXIT_LINGER_S = 0.5
HOOK_ORDER = ("on_success", "on_failure", "on_cancel", "cleanup")
ENV_ALLOWLIST = {
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "LANG",
    "TERM",
    "TZ",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
}
ENV_LINE_RE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$")


def allowlisted_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The agent's variables a step may see: the allowlist (either case) and `LC_*`."""
    return {
        name: value
        for name, value in environ.items()
        if name.upper() in ENV_ALLOWLIST or name.startswith("LC_")
    }


def drift_message(workflow: str) -> str:
    """docs/design/authoring.md's message for a lock that no longer matches the sources."""
    return (
        f"workflow {workflow!r} changed since the lock file was compiled; "
        "run `conveyor compile` and commit the lock"
    )


def parse_env_file(text: str) -> dict[str, str]:
    """`NAME=value` lines of `$CONVEYOR_ENV`; raises ValueError naming the first bad line."""
    values: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        found = ENV_LINE_RE.match(line)
        if not found:
            raise ValueError(f"line {number} is not NAME=value")
        name, value = found.groups()
        if name == "PATH" or name.startswith("CONVEYOR_"):
            raise ValueError(f"line {number} sets the reserved variable {name}")
        values[name] = value
    return values


def retry_delay_ms(retry: Any, attempt: int) -> int:
    """Wait after failed attempt `attempt` (1-based): exponential `min(delay·2^(n-1), max)` or fixed."""
    if retry.backoff == "fixed":
        return int(retry.delay_ms)
    return int(min(retry.delay_ms * 2 ** (attempt - 1), retry.max_delay_ms))


def emit_timeout_s() -> float:
    """How long `ctx.emit` waits for the orchestrator: `CONVEYOR_EMIT_TIMEOUT_MS` (tests), else 30 s."""
    try:
        value = int(os.environ.get("CONVEYOR_EMIT_TIMEOUT_MS", ""))
    except ValueError:
        return DEFAULT_EMIT_TIMEOUT_S
    return value / 1000 if value > 0 else DEFAULT_EMIT_TIMEOUT_S


class SetupFailed(ConveyorError):
    """The job cannot start its steps: `reason` is the job's reason code."""

    def __init__(self, reason: str, error: str) -> None:
        super().__init__(error)
        self.reason, self.error = reason, error


class Emitter:
    """JSON lines on stdout, one message per line, flushed at once."""

    def __init__(self, stream: TextIO, job_id: str) -> None:
        self.stream = stream
        self.job_id = job_id

    def __call__(self, message_type: str, /, **fields: Any) -> None:
        message = {"type": message_type, "job_id": self.job_id, **fields}
        self.stream.write(json.dumps(message, default=str) + "\n")
        self.stream.flush()


@dataclass
class ChildOutcome:
    """How a step process ended."""

    status: str
    reason: str | None = None
    error: str | None = None
    outputs: dict[str, Any] | None = None
    exit_code: int | None = None
    retry: bool = True
    began: bool = False
    result: dict[str, Any] | None = None


@dataclass
class StepRecord:
    """What later steps and hooks know about a finished step."""

    name: str
    status: str
    outputs: dict[str, Any] | None
    reason: str | None = None


@dataclass
class StopRequest:
    """Why the running child must stop: `cancel`, `force`, `step_timeout` or `job_timeout`."""

    kind: str
    grace_s: float


@dataclass
class _Child:
    process: asyncio.subprocess.Process
    writer: asyncio.StreamWriter
    groups: set[int] = field(default_factory=set)
    stop: StopRequest | None = None
    stop_event: asyncio.Event = field(default_factory=asyncio.Event)
    # A container job's step: the tag of the pid files its commands write in the job container.
    exec_tag: str | None = None


class Runner:
    """Runs one job: setup (checkout, requirements, drift, rules), steps, hooks; reports everything."""

    def __init__(
        self,
        spec: JobSpec,
        workspace: Path,
        *,
        emit: Emitter,
        venvs_dir: Path | None = None,
        clock: Callable[[], float] = time.monotonic,
        spares: StepSpares | None = None,
        mirrors: Mirrors | None = None,
    ) -> None:
        self.spec = spec
        self.spares = spares or StepSpares(Path("/"))
        self.workspace = workspace
        self.src = workspace / "src"
        self.tmp = workspace / "tmp"
        self.emit = emit
        self.venvs_dir = venvs_dir or workspace / "venvs"
        self.mirrors = mirrors
        self.clock = clock
        self.masker = Masker(
            [*spec.secrets.values(), *credential_values(spec.repo.auth_header if spec.repo else None)]
        )
        self.logs: dict[int, StepLog] = {}
        self.held: dict[int, list[dict[str, Any]]] = {}
        self.announced: set[int] = set()
        self.groups: set[int] = set()
        self.python = sys.executable
        self.path_prefix: list[str] = []
        self.env_updates: dict[str, str] = {}
        self.records: dict[str, StepRecord] = {}
        self.child: _Child | None = None
        self.cancel: StopRequest | None = None
        self.cancel_reason: str | None = None
        self.job_timed_out = False
        self.next_index = 1
        self.started = clock()
        self.pending_emits: dict[str, _Child] = {}
        self.in_hooks = False
        self.containers: Any = None  # a `containers.JobContainers` (imported when a job needs one)
        self.containers_import: asyncio.Future[Any] | None = None
        self.containers_starting: asyncio.Future[None] | None = None
        self.pull_gate = asyncio.Event()
        self.setup_abandoned = False
        self._later: set[asyncio.Future[None]] = set()
        self.job_container: JobContainer | None = None

    # -- logs ---------------------------------------------------------------------------------------

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

    # -- environment ---------------------------------------------------------------------------------

    def step_environment(self, env_file: Path, path_file: Path) -> dict[str, str]:
        """Allowlist < dispatched env < job env < set_env, then PATH additions and CONVEYOR_* last."""
        spec, event = self.spec, self.spec.context.event
        env = allowlisted_environment(os.environ)
        env.update({"TMPDIR": str(self.tmp), "CI": "true"})
        env.update(spec.env)
        env.update(spec.job.env)
        env.update(self.env_updates)
        path_parts = [*self.path_prefix]
        # The requirements venv is the host's: a container job's commands have the image's tools instead.
        if self.python != sys.executable and self.job_container is None:
            path_parts.append(str(Path(self.python).parent))
        base_path = os.environ.get("PATH", os.defpath)
        env["PATH"] = os.pathsep.join([*path_parts, base_path])
        env.update(
            {
                "CONVEYOR_RUN_ID": spec.run_id,
                "CONVEYOR_JOB_ID": spec.job_id,
                "CONVEYOR_WORKFLOW": spec.workflow.name,
                "CONVEYOR_JOB": spec.job.name,
                "CONVEYOR_SHA": str(event.get("sha") or (spec.repo.sha if spec.repo else "")),
                "CONVEYOR_REF": str(event.get("ref") or (spec.repo.ref if spec.repo else "") or ""),
                "CONVEYOR_BRANCH": str(event.get("branch") or ""),
                "CONVEYOR_EVENT_TYPE": str(event.get("type") or ""),
                "CONVEYOR_WORKSPACE": str(self.src),
                "CONVEYOR_ENV": str(env_file),
                "CONVEYOR_PATH": str(path_file),
                "CONVEYOR_LOCAL": "1" if spec.local else "0",
            }
        )
        return {name: value for name, value in env.items() if name.upper() not in {"CONVEYOR_KILL_GRACE_MS"}}

    # -- child processes -----------------------------------------------------------------------------

    async def run_child(
        self,
        index: int,
        message: dict[str, Any],
        *,
        timeout_ms: int | None,
        on_begin: Callable[[], None],
    ) -> ChildOutcome:
        """Start a step process, feed it `message`, relay its output and control lines, wait for it."""
        env_file = self.tmp / f"conveyor-env-{index}"
        path_file = self.tmp / f"conveyor-path-{index}"
        env_file.write_text("")
        path_file.write_text("")
        step_env = self.step_environment(env_file, path_file)
        message = {**message, "env": step_env, "secrets": self.spec.secrets}
        exec_tag = None
        if self.job_container is not None:
            exec_tag = f"{index}-{self.clock():.6f}".replace(".", "")
            message["container"] = {
                **self.job_container.as_message(os.environ.get("PATH", os.defpath)),
                "exec_tag": exec_tag,
            }
        bootstrap = bootstrap_environment(step_env, os.environ)
        # A cold process's `ready` line is read (and ignored) by `_control` with the rest.
        step = await self.spares.take(self.python, bootstrap) or await spawn_step(
            self.python, bootstrap, self.src
        )
        process, reader, writer = step.process, step.reader, step.writer
        child = _Child(process, writer, {process.pid}, exec_tag=exec_tag)
        self.child = child
        self._remember_group(process.pid)
        if self.cancel is not None and self._cancel_applies(self.cancel):
            self._request_stop(child, self.cancel)
        outcome = ChildOutcome(status="failed")
        writer.write((json.dumps(message) + "\n").encode())
        await writer.drain()

        def begin() -> None:
            outcome.began = True
            on_begin()

        assert process.stdout is not None and process.stderr is not None
        pumps = [
            asyncio.create_task(self._pump(index, process.stdout, "out")),
            asyncio.create_task(self._pump(index, process.stderr, "err")),
        ]
        control = asyncio.create_task(self._control(child, reader, outcome, begin))
        timeout = None if timeout_ms is None else timeout_ms / 1000
        waiter = asyncio.create_task(process.wait())
        stopper = asyncio.create_task(child.stop_event.wait())
        try:
            done, _ = await asyncio.wait(
                {waiter, stopper}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
            if not done:
                self._request_stop(child, StopRequest("step_timeout", kill_grace_s()))
            if not waiter.done():
                assert child.stop is not None
                await self._stop(child, child.stop, waiter)
            await waiter
            # The control channel ends with the process; give it a moment to deliver the last lines.
            await asyncio.wait({control, *pumps}, timeout=EXIT_LINGER_S)
        finally:
            for task in (control, *pumps, stopper):
                task.cancel()
            writer.close()
            self.child = None
            for pending, owner in list(self.pending_emits.items()):
                if owner is child:
                    del self.pending_emits[pending]
        # Replacements start once this step is over, so they never compete with it for the CPU.
        self.spares.refill(self.python, bootstrap)
        self._apply_env_files(index, env_file, path_file, outcome)
        return self._conclude(child, outcome, process.returncode)

    def _conclude(self, child: _Child, outcome: ChildOutcome, returncode: int | None) -> ChildOutcome:
        stop = child.stop
        if stop is not None and stop.kind in ("cancel", "force"):
            outcome.status, outcome.reason, outcome.retry = "cancelled", "cancelled", False
            outcome.error = outcome.error or "cancelled"
        elif stop is not None and stop.kind in ("step_timeout", "job_timeout"):
            outcome.status, outcome.reason = "timed_out", stop.kind
            outcome.error = "step timed out" if stop.kind == "step_timeout" else "job timed out"
            outcome.retry = stop.kind == "step_timeout"
        elif outcome.result is None:
            outcome.status, outcome.reason = "failed", "step_failed"
            outcome.exit_code = returncode
            how = (
                f"was killed by signal {-returncode}"
                if returncode and returncode < 0
                else f"exited with code {returncode}"
            )
            outcome.error = f"the step process {how} before reporting a result"
        return outcome

    async def _pump(self, index: int, stream: asyncio.StreamReader, name: str) -> None:
        masker = StreamMasker(self.masker)
        partial = ""
        decoder = _utf8_decoder()
        try:
            while data := await stream.read(65536):
                partial += masker.feed(decoder.decode(data))
                *lines, partial = partial.split("\n")
                for line in lines:
                    self._add_line(index, line, name)
                if len(partial) > 64 * 1024:
                    self._add_line(index, partial, name)
                    partial = ""
        finally:
            partial += masker.feed(decoder.decode(b"", final=True)) + masker.flush()
            for line in partial.split("\n") if partial else []:
                self._add_line(index, line, name)

    async def _control(
        self, child: _Child, reader: asyncio.StreamReader, outcome: ChildOutcome, begin: Callable[[], None]
    ) -> None:
        while line := await reader.readline():
            try:
                message = json.loads(line)
            except ValueError:
                continue
            kind = message.get("type")
            if kind == "begin":
                begin()
            elif kind == "proc":
                pgid = int(message["pgid"])
                child.groups.add(pgid)
                self._remember_group(pgid)
                if child.stop is not None:
                    signal_group(pgid, signal.SIGKILL if child.stop.kind == "force" else signal.SIGTERM)
            elif kind == "set_env":
                self.env_updates[str(message["name"])] = str(message["value"])
            elif kind == "add_path":
                self.path_prefix.insert(0, str(message["dir"]))
            elif kind == "emit":
                self.pending_emits[str(message["request_id"])] = child
                self.emit(
                    "event.emit",
                    request_id=message["request_id"],
                    name=message["name"],
                    payload=self.masker.mask_json(message.get("payload") or {}),
                    target_repos=message.get("target_repos"),
                )
            elif kind == "artifact":
                # Artifact transfers are the agent's (it holds the job's credential): docs/design/artifacts.md §5.
                self.pending_emits[str(message["request_id"])] = child
                self.emit("artifact.request", **{k: v for k, v in message.items() if k != "type"})
            elif kind == "result":
                outcome.result = message
                outcome.status = str(message.get("status", "failed"))
                outcome.reason = message.get("reason")
                outcome.error = message.get("error")
                outcome.outputs = message.get("outputs")
                outcome.exit_code = message.get("exit_code")
                outcome.retry = bool(message.get("retry", True))

    def _apply_env_files(self, index: int, env_file: Path, path_file: Path, outcome: ChildOutcome) -> None:
        try:
            self.env_updates.update(parse_env_file(env_file.read_text(encoding="utf-8", errors="replace")))
        except ValueError as error:
            self.log(index, f"$CONVEYOR_ENV: {error}")
            if outcome.status == "success":
                outcome.status, outcome.reason = "failed", "env_file_invalid"
                outcome.error = f"env_file_invalid: {error}"
        except OSError:
            pass
        try:
            for line in path_file.read_text(encoding="utf-8", errors="replace").splitlines():
                if line.strip():
                    self.path_prefix.insert(0, line.strip())
        except OSError:
            pass

    def _remember_group(self, pgid: int) -> None:
        if pgid not in self.groups:
            self.groups.add(pgid)
            self.emit("proc", pgid=pgid)

    def _request_stop(self, child: _Child, request: StopRequest) -> None:
        if child.stop is not None and not (request.kind == "force" and child.stop.kind != "force"):
            return
        child.stop = request
        child.stop_event.set()

    async def _stop(self, child: _Child, request: StopRequest, waiter: asyncio.Task[int]) -> None:
        """SIGTERM the step's group and every `ctx.sh` group; SIGKILL whatever is left after the grace.

        In a container job the step's commands run in the job container: they get the same signals there.
        """
        if request.kind != "force":
            for pgid in list(child.groups):
                signal_group(pgid, signal.SIGTERM)
            await self._signal_container_commands(child, "TERM")
            deadline = self.clock() + request.grace_s
            while self.clock() < deadline:
                if child.stop is not None and child.stop.kind == "force":
                    break
                if waiter.done() and not any(_group_alive(pgid) for pgid in child.groups):
                    break
                await asyncio.sleep(0.05)
            else:
                await self._kill(child)
                return
            if child.stop is None or child.stop.kind != "force":
                # The step is gone; a command of its in the container may still be in its own grace.
                await self._signal_container_commands(child, "KILL", after_s=request.grace_s)
                return
        await self._kill(child)

    async def _kill(self, child: _Child) -> None:
        for pgid in list(child.groups):
            signal_group(pgid, signal.SIGKILL)
        await self._signal_container_commands(child, "KILL")

    async def _signal_container_commands(self, child: _Child, signal_name: str, after_s: float = 0.0) -> None:
        if child.exec_tag is None or self.containers is None:
            return
        if after_s:
            containers, tag = self.containers, child.exec_tag
            self._later.add(asyncio.ensure_future(self._signal_later(containers, tag, signal_name, after_s)))
            return
        await self.containers.signal_commands(child.exec_tag, signal_name)

    async def _signal_later(self, containers: Any, tag: str, signal_name: str, after_s: float) -> None:
        await asyncio.sleep(after_s)
        await containers.signal_commands(tag, signal_name)

    # -- control from the agent --------------------------------------------------------------------

    def request_cancel(self, force: bool, reason: str | None = None) -> None:
        """Graceful: stop the running step with the job's grace period; force: SIGKILL now, no hooks."""
        grace = self.spec.job.grace_period_ms / 1000
        request = StopRequest("force" if force else "cancel", 0.0 if force else grace)
        if self.cancel is not None and not (force and self.cancel.kind != "force"):
            return
        self.cancel = request
        self.cancel_reason = reason or self.cancel_reason
        if self.child is not None and self._cancel_applies(request):
            self._request_stop(self.child, request)

    def _cancel_applies(self, request: StopRequest) -> bool:
        # Hooks (`on_cancel`, `cleanup`) run after a graceful cancel; only a forced one stops them.
        return request.kind == "force" or not self.in_hooks

    def answer_emit(self, answer: Mapping[str, Any]) -> None:
        """Pass the orchestrator's answer to `event.emit` back to the waiting step."""
        child = self.pending_emits.pop(str(answer.get("request_id")), None)
        if child is not None:
            child.writer.write((json.dumps(dict(answer)) + "\n").encode())

    async def _read_control(self, stdin: asyncio.StreamReader) -> None:
        while line := await stdin.readline():
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if not isinstance(message, dict):
                continue
            if "cancel" in message:
                options = message["cancel"] or {}
                self.request_cancel(bool(options.get("force")), options.get("reason"))
            elif "emit_result" in message:
                self.answer_emit(message["emit_result"])
            elif "artifact_result" in message:
                self.answer_emit(message["artifact_result"])

    async def _watch_job_deadline(self) -> None:
        timeout_ms = self.spec.job.timeout_ms
        if timeout_ms is None:
            return
        await asyncio.sleep(timeout_ms / 1000)
        self.job_timed_out = True
        if self.child is not None:
            self._request_stop(self.child, StopRequest("job_timeout", kill_grace_s()))

    # -- the job --------------------------------------------------------------------------------------

    def _context(self, step: str, outcome: dict[str, Any] | None = None) -> dict[str, Any]:
        spec = self.spec
        event = spec.context.event
        return {
            "event": event,
            "inputs": (event.get("payload") or {}).get("inputs") or {},
            "matrix": spec.matrix,
            "needs": {name: result.model_dump() for name, result in spec.upstream.items()},
            "workflow": spec.workflow.name,
            "job": spec.job.name,
            "step": step,
            "run_id": spec.run_id,
            "emit_timeout_s": emit_timeout_s(),
            "environment": spec.environment,
            "is_local": spec.local,
            "workspace": str(self.workspace),
            "outputs_of": {
                name: (record.outputs if record.status == "success" else None)
                for name, record in self.records.items()
            },
            "outcome": outcome,
        }

    def _base_message(self, kind: str, step: str, attempt: int = 1) -> dict[str, Any]:
        return {
            "type": "run",
            "kind": kind,
            "root": str(self.src),
            "workflow_file": self.spec.workflow.file,
            "workflow": self.spec.workflow.name,
            "job": self.spec.job.name,
            "step": step,
            "attempt": attempt,
            "ctx": self._context(step),
        }

    async def setup(self) -> tuple[str, dict[str, int]]:
        """Checkout, requirements, drift check, import and job rules; returns (`passed`|`skipped`, hooks)."""
        spec = self.spec
        self.tmp.mkdir(parents=True, exist_ok=True)
        if spec.job.container is not None or spec.job.services:
            # The engine client's import, and then the job's network, services and container, overlap the
            # checkout and the drift check (the workspace the container mounts exists already); a missing
            # image waits for the drift check before it is pulled. `remove_containers` waits for them.
            self.containers_import = asyncio.ensure_future(
                asyncio.to_thread(importlib.import_module, "conveyor.agent.containers")
            )
            self.containers_starting = asyncio.ensure_future(self.start_containers())
        else:
            # A ready runner's spares preload the engine client for a container job that did not come: the
            # replacements a host job starts after each step need not compete with its next one for it.
            self.spares.preload_containers = False
        if spec.repo is not None:
            base_env = {**allowlisted_environment(os.environ), "TMPDIR": str(self.tmp)}

            def setup_log(text: str, stream: str) -> None:
                self.log(0, text, stream)

            try:
                # A job without checkout needs only `.conveyor/`: a blob-less sparse fetch from the clone
                # URL is smaller than the mirror's full tree, and keeps partial clones out of the mirror.
                if self.mirrors is not None and spec.job.checkout:
                    await self.mirrors.checkout(spec.repo, self.src, base_env=base_env, log=setup_log)
                else:
                    await checkout(
                        spec.repo, self.src, base_env=base_env, log=setup_log, sparse=not spec.job.checkout
                    )
            except (CheckoutFailed, OSError) as error:
                raise SetupFailed("checkout_failed", f"checkout failed: {error}") from None
        elif not self.src.is_dir():
            raise SetupFailed("checkout_failed", f"no source at {self.src}")
        requirements = self.src / ".conveyor" / "requirements.txt"
        if requirements.is_file() and requirement_lines(requirements.read_text(encoding="utf-8")):
            try:
                venv = await ensure_venv(requirements, self.venvs_dir, lambda t, s: self.log(0, t, s))
            except (RequirementsFailed, OSError) as error:
                raise SetupFailed("requirements_failed", f"requirements failed: {error}") from None
            self.python = str(venv_python(venv))
            remember_interpreter(self.venvs_dir, self.python)
        else:
            remember_interpreter(self.venvs_dir, None)
        try:
            actual = content_hash_of_checkout(self.src, spec.workflow.hashed_files)
        except OSError as error:
            self.log(0, f"drift check: {error}")
            raise SetupFailed("lock_out_of_date", drift_message(spec.workflow.name)) from None
        if actual != spec.workflow.content_hash:
            self.log(0, f"content hash {actual} differs from the lock's {spec.workflow.content_hash}")
            raise SetupFailed("lock_out_of_date", drift_message(spec.workflow.name))
        if self.containers_starting is not None:
            self.pull_gate.set()
            await self.containers_starting
        message = self._base_message("inspect", "")
        message["steps"] = [step.name for step in spec.job.steps]
        message["hooks"] = list(spec.job.hooks)
        outcome = await self.run_child(0, message, timeout_ms=DEFAULT_HOOK_TIMEOUT_MS, on_begin=lambda: None)
        if outcome.status in ("cancelled", "timed_out"):
            raise SetupFailed(outcome.reason or outcome.status, outcome.error or outcome.status)
        if outcome.result is None or outcome.status != "success":
            reason = (
                outcome.reason if outcome.reason in ("import_error", "lock_out_of_date") else "import_error"
            )
            raise SetupFailed(reason, outcome.error or "importing the workflow failed")
        report = outcome.result["inspect"]
        unlisted = sorted(set(report["imported"]) - set(spec.workflow.hashed_files))
        if unlisted or report["missing"]:
            for item in unlisted:
                self.log(0, f"{item} is imported but not listed in the lock")
            for item in report["missing"]:
                self.log(0, f"{item} is in the lock but not in the checkout")
            raise SetupFailed("lock_out_of_date", drift_message(spec.workflow.name))
        rules = report["rules"]
        if rules["status"] == "error":
            raise SetupFailed("rule_error", self.masker.mask(rules.get("error") or "a rule raised"))
        if rules["status"] == "skipped":
            self.log(0, f"skipped: rule {rules['label']!r} did not pass")
            return "skipped", report["hooks"]
        return "passed", report["hooks"]

    async def start_containers(self) -> None:
        """The job's network, services and job container (docs/design/containers.md §4), before any step code."""
        self.spares.prepare_for_containers()
        # Imported here (started in a thread when setup began): aiodocker is a cost a host job need not pay.
        if self.containers_import is not None:
            await self.containers_import
        from conveyor.agent.containers import JobContainers

        self.containers = JobContainers(
            self.spec.job,
            job_id=self.spec.job_id,
            agent_id=os.environ.get(AGENT_ID_VARIABLE) or local_agent_id(),
            workspace=self.workspace,
            engine=engine_address(os.environ),
            log=lambda text: self.log(0, text),
            stopped=lambda: self.cancel is not None or self.job_timed_out or self.setup_abandoned,
            pull_gate=self.pull_gate,
        )
        try:
            self.job_container = await self.containers.start()
        except ContainerFailed as failure:
            if self.setup_abandoned:
                raise SetupFailed("cancelled", "the setup failed while the containers started") from None
            if self.job_timed_out:
                raise SetupFailed("job_timeout", "job timed out while its containers started") from None
            raise SetupFailed(failure.reason, failure.message) from None
        if self.cancel is not None:
            raise SetupFailed("cancelled", "cancelled")
        if self.job_timed_out:
            raise SetupFailed("job_timeout", "job timed out while its containers started")

    async def remove_containers(self) -> None:
        """Remove what the job started on the engine (idempotent); a failure is left to the agent's sweep."""
        starting, self.containers_starting = self.containers_starting, None
        if starting is not None and not starting.done():
            # The setup failed (a checkout, say) while the containers started: what they are waiting for
            # ends, and what was created is known before it is removed.
            self.setup_abandoned = True
            self.pull_gate.set()
            await asyncio.wait({starting})
        if starting is not None and not starting.cancelled():
            starting.exception()  # told by the setup when it waited; here it is only retrieved
        containers, self.containers, self.job_container = self.containers, None, None
        if containers is None:
            return
        for pending in self._later:
            pending.cancel()
        try:
            await containers.remove()
        except Exception as problem:  # the job's result must still be reported
            print(f"conveyor runner: removing the job's containers: {problem!r}", file=sys.stderr)

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
            decisive = _aggregate([result.status for result in spec.upstream.values()])
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

    def kill_leftovers(self) -> None:
        """SIGKILL every process group the job recorded (a step's `sleep 300 &` included), and the spare."""
        for pid in self.spares.pids:
            signal_group(pid, signal.SIGKILL)
        for pgid in self.groups:
            signal_group(pgid, signal.SIGKILL)


def _aggregate(statuses: list[str]) -> str:
    for status in ("failed", "timed_out", "cancelled"):
        if status in statuses:
            return status
    return "success" if "success" in statuses or not statuses else "skipped"


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _now_ms() -> int:
    return int(time.time() * 1000)


def _utf8_decoder() -> Any:
    import codecs

    return codecs.getincrementaldecoder("utf-8")(errors="replace")


async def _stdin_reader() -> asyncio.StreamReader:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=64 * 1024 * 1024)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    return reader


def bootstrap_environment(step_env: Mapping[str, str], environ: Mapping[str, str]) -> dict[str, str]:
    """A step process's environment at start (its `run` message then makes `step_env` its environment)."""
    bootstrap = dict(step_env)
    for name in ("CONVEYOR_KILL_GRACE_MS", "PYTHONPATH"):
        if environ.get(name):
            bootstrap[name] = environ[name]
    return bootstrap


@dataclass(frozen=True)
class Placement:
    """Where a runner works: its workspace, the venvs directory, the mirrors (None: direct checkout)."""

    workspace: Path
    venvs_dir: Path | None = None
    mirrors: Mirrors | None = None


def mirrors_of(directory: str | Path | None, max_bytes: object = None) -> Mirrors | None:
    """The mirrors under `directory` with their size bound (default when absent); None without a directory."""
    if not directory:
        return None
    bound = max_bytes if isinstance(max_bytes, int) and not isinstance(max_bytes, bool) else DEFAULT_MAX_BYTES
    return Mirrors(Path(directory), max_bytes=bound)


def _placement(envelope: bytes) -> Placement:
    """A `--wait` runner's first line: its workspace (created), venvs directory and mirrors.

    An agent from before the mirror sends no `mirrors`: that runner checks out directly.
    """
    where = json.loads(envelope)
    workspace = Path(where["workspace"]).resolve()
    workspace.mkdir(parents=True, exist_ok=True)
    return Placement(
        workspace,
        Path(where["venvs"]) if where.get("venvs") else None,
        mirrors_of(where.get("mirrors"), where.get("mirror_max_bytes")),
    )


async def _preload_engine_client() -> None:
    """A runner waiting for its job on a host with an engine imports the engine client (aiodocker, ~160 ms)
    before it says it is ready, in a thread while its spares start: a container job's setup then starts its
    containers at once, and the wait is the agent's idle time. A host without an engine never pays for it."""
    try:
        await asyncio.to_thread(importlib.import_module, "conveyor.agent.containers")
    except Exception as problem:  # the job that needs it reports the failure; a host job does not care
        print(f"conveyor runner: importing the engine client: {problem!r}", file=sys.stderr)


async def main_async(placement: Placement | None, spare_python: str | None = None) -> int:
    """Read the spec, run the job, report; exit 0 whenever `job.finished` was written.

    Without a placement (`--wait`, a runner started before its job) the first line is
    `{"workspace": ..., "venvs": ..., "mirrors": ..., "mirror_max_bytes": ...}` and the spec follows it.
    """
    spares = StepSpares(Path("/"))
    # Before a job is known: the job's own variables come with each step's `run`.
    # `spare_python`: the requirements venv of the agent's last job, which a repeat of that job will want.
    spares.refill(
        spare_python or sys.executable,
        bootstrap_environment(allowlisted_environment(os.environ), os.environ),
    )
    stdin = await _stdin_reader()
    if placement is None and engine_may_answer(engine_address(os.environ)):
        # Its spares too, while they wait: else the first one a container job takes (the setup's inspection)
        # would import the client only then, with the job waiting behind it.
        spares.prepare_for_containers()
        await _preload_engine_client()
    freeze_startup_heap()
    if placement is None:
        try:
            sys.stdout.write(json.dumps({"type": "ready"}) + "\n")
            sys.stdout.flush()
        except BrokenPipeError:  # the agent that started this runner is gone
            await spares.close()
            return 2
        envelope = await stdin.readline()
        if not envelope:  # the agent no longer needs this ready runner
            await spares.close()
            return 2
        placement = _placement(envelope)
    first = await stdin.readline()
    if not first:
        print("conveyor runner: no job spec on stdin", file=sys.stderr)
        await spares.close()
        return 2
    spec = JobSpec.model_validate_json(first)
    runner = Runner(
        spec,
        placement.workspace,
        emit=Emitter(sys.stdout, spec.job_id),
        venvs_dir=placement.venvs_dir,
        spares=spares,
        mirrors=placement.mirrors,
    )
    control = asyncio.create_task(runner._read_control(stdin))
    loop = asyncio.get_running_loop()
    # A runner told to stop by its parent cancels its job gracefully; a second signal forces.
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, lambda: runner.request_cancel(runner.cancel is not None))
    try:
        await runner.run()
    finally:
        control.cancel()
        await runner.remove_containers()
        await spares.close()
        runner.kill_leftovers()
    return 0


def main(argv: list[str] | None = None) -> None:
    """Entry point of `python -m conveyor.agent.runner`."""
    parser = argparse.ArgumentParser(prog="python -m conveyor.agent.runner")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--workspace", type=Path)
    where.add_argument("--wait", action="store_true", help="start now; the workspace comes on stdin")
    parser.add_argument("--venvs", type=Path, default=None)
    parser.add_argument("--mirrors", type=Path, default=None, help="check out through mirrors kept here")
    parser.add_argument("--mirror-max-bytes", type=int, default=None)
    parser.add_argument("--spare-python", default=None, help="start the spare step processes with this")
    options = parser.parse_args(argv)
    placement = (
        None
        if options.wait
        else Placement(
            options.workspace.resolve(), options.venvs, mirrors_of(options.mirrors, options.mirror_max_bytes)
        )
    )
    # Not `asyncio.run`: its clean-up cancels leftover tasks and waits for them, and one cancelled inside
    # `create_subprocess_exec` (a spare still starting) can wait for ever on Python 3.11. `os._exit`
    # ends them all; the spares' own sessions end when their control channels close.
    loop = asyncio.new_event_loop()
    try:
        code = loop.run_until_complete(main_async(placement, options.spare_python))
    except BaseException:  # as an uncaught exception ends a program, without waiting for leftover tasks
        traceback.print_exc()
        code = 1
    with contextlib.suppress(OSError):
        sys.stdout.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
