"""`JobProcess`: how the agent (and `conveyor run local`) runs one job in a runner child process.

The runner is `python -m conveyor.agent.runner` in its own session. Whatever happens to it — a crash, a
SIGKILL, a bug — the caller gets a well-formed message stream ending in exactly one `job.finished`: a runner
that exits without one yields `job.finished {status: failed, reason: runner_crashed}` (and closes any step it
left open), and every process group it reported is killed.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

from conveyor.agent.requirements import remembered_interpreter
from conveyor.agent.signals import signal_group
from conveyor.agent.spec import JobSpec
from conveyor.agent.step_spare import is_ready_line
from conveyor.aio import wait_event

STDERR_TAIL_LINES = 40


async def spawn_runner(argv: list[str], env: Mapping[str, str]) -> asyncio.subprocess.Process:
    """Start a runner child in a session of its own, its stdin, stdout and stderr piped."""
    return await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=dict(env),
        start_new_session=True,
        limit=64 * 1024 * 1024,
    )


class JobProcess:
    """One job's runner child: `start` yields its messages, `cancel` stops it, `kill` ends it at once.

    Messages are dicts with a `type`: `proc {pgid}`, `step.started`, `log {step_index, seq, lines}`,
    `step.finished`, `event.emit {request_id, name, payload, target_repos}` (answer with `answer_emit`) and
    finally `job.finished {status, reason, outputs, duration_ms, error}`.
    """

    def __init__(
        self,
        *,
        python: str | None = None,
        venvs_dir: Path | None = None,
        env: Mapping[str, str] | None = None,
        on_stderr: Callable[[str], None] | None = None,
        mirrors_dir: Path | None = None,
        mirror_max_bytes: int | None = None,
    ) -> None:
        self.python = python or sys.executable
        self.venvs_dir = venvs_dir
        # The agent's per-repository git mirrors (`mirror.py`); None: the runner checks out directly.
        self.mirrors_dir = mirrors_dir
        self.mirror_max_bytes = mirror_max_bytes
        self.env = dict(os.environ if env is None else env)
        self.on_stderr = on_stderr
        self.process: asyncio.subprocess.Process | None = None
        self.groups: set[int] = set()
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL_LINES)
        self._pending_control: list[dict[str, Any]] = []
        self._finished = False

    @property
    def pid(self) -> int | None:
        """The runner's pid (also its process group), once started."""
        return None if self.process is None else self.process.pid

    async def start(
        self,
        spec: JobSpec | Mapping[str, Any],
        workspace: Path,
        ready: asyncio.subprocess.Process | None = None,
    ) -> AsyncIterator[dict[str, Any]]:
        """Run the job; yields runner messages, always ending with one `job.finished`.

        `ready` is a runner started with `--wait` (`ReadyRunner.take`); one that turns out to be dead before
        it said anything is replaced by a runner started now, so the job never pays for a broken one.
        """
        document = spec.model_dump(mode="json") if isinstance(spec, JobSpec) else dict(spec)
        os.makedirs(workspace, exist_ok=True)
        if ready is not None:
            self.process = ready
            self._write(
                {
                    "workspace": str(workspace),
                    "venvs": None if self.venvs_dir is None else str(self.venvs_dir),
                    "mirrors": None if self.mirrors_dir is None else str(self.mirrors_dir),
                    "mirror_max_bytes": self.mirror_max_bytes,
                }
            )
        else:
            self.process = await self._spawn(["--workspace", str(workspace)])
        self.groups.add(self.process.pid)
        self._write(document)
        for message in self._pending_control:
            self._write(message)
        self._pending_control.clear()
        stderr_task = asyncio.create_task(self._read_stderr())
        open_steps: dict[int, dict[str, Any]] = {}
        heard = False
        try:
            while True:
                assert self.process.stdout is not None
                async for raw in self.process.stdout:
                    try:
                        message = json.loads(raw)
                    except ValueError:
                        self.stderr_tail.append(raw.decode("utf-8", errors="replace").rstrip("\n"))
                        continue
                    kind = message.get("type")
                    if kind == "ready":
                        continue
                    heard = True
                    if kind == "proc":
                        self.groups.add(int(message["pgid"]))
                    elif kind == "step.started":
                        open_steps[message["step_index"]] = message
                    elif kind == "step.finished":
                        open_steps.pop(message["step_index"], None)
                    elif kind == "job.finished":
                        self._finished = True
                    yield message
                code = await self.process.wait()
                await asyncio.wait({stderr_task}, timeout=1)
                if ready is not None and not heard and not self._finished:
                    # The ready runner died before taking the job: start one now and give it the job.
                    ready = None
                    self.stderr_tail.clear()
                    self.process = await self._spawn(["--workspace", str(workspace)])
                    self.groups.add(self.process.pid)
                    self._write(document)
                    stderr_task.cancel()
                    stderr_task = asyncio.create_task(self._read_stderr())
                    continue
                if not self._finished:
                    for message in self._crash_messages(document, open_steps, code):
                        yield message
                break
        finally:
            stderr_task.cancel()
            self.kill_groups()

    async def _spawn(self, where: list[str]) -> asyncio.subprocess.Process:
        argv = [self.python, "-m", "conveyor.agent.runner", *where]
        if self.venvs_dir is not None:
            argv += ["--venvs", str(self.venvs_dir)]
        if self.mirrors_dir is not None:
            argv += ["--mirrors", str(self.mirrors_dir)]
            if self.mirror_max_bytes is not None:
                argv += ["--mirror-max-bytes", str(self.mirror_max_bytes)]
        return await spawn_runner(argv, self.env)

    def _crash_messages(
        self, document: Mapping[str, Any], open_steps: Mapping[int, dict[str, Any]], code: int
    ) -> list[dict[str, Any]]:
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        tail = "\n".join(self.stderr_tail)
        error = f"the runner {how} without finishing the job" + (f":\n{tail}" if tail else "")
        job_id = document.get("job_id")
        messages: list[dict[str, Any]] = [
            {
                "type": "step.finished",
                "job_id": job_id,
                "step_index": index,
                "name": started.get("name"),
                "kind": started.get("kind"),
                "lock_index": started.get("lock_index"),
                "status": "failed",
                "reason": "runner_crashed",
                "exit_code": None,
                "outputs": None,
                "attempts": 1,
                "duration_ms": 0,
                "error": "the runner crashed",
            }
            for index, started in sorted(open_steps.items())
        ]
        messages.append(
            {
                "type": "job.finished",
                "job_id": job_id,
                "status": "failed",
                "reason": "runner_crashed",
                "outputs": {},
                "duration_ms": 0,
                "error": error,
            }
        )
        self._finished = True
        return messages

    async def _read_stderr(self) -> None:
        assert self.process is not None and self.process.stderr is not None
        async for raw in self.process.stderr:
            line = raw.decode("utf-8", errors="replace").rstrip("\n")
            self.stderr_tail.append(line)
            if self.on_stderr is not None:
                self.on_stderr(line)

    def _write(self, message: Mapping[str, Any]) -> None:
        process = self.process
        if process is None or process.stdin is None or process.returncode is not None:
            return
        try:
            process.stdin.write((json.dumps(message) + "\n").encode())
        except (BrokenPipeError, ConnectionResetError, RuntimeError):
            pass

    def _control(self, message: dict[str, Any]) -> None:
        if self.process is None:
            self._pending_control.append(message)
        else:
            self._write(message)

    def cancel(self, force: bool = False, reason: str | None = None) -> None:
        """Graceful: stop the step within the job's grace, run `on_cancel` and `cleanup`; force: SIGKILL now."""
        self._control({"cancel": {"force": force, "reason": reason}})

    def answer_artifact(self, request_id: str, *, result: Any = None, error: str | None = None) -> None:
        """Answer an `artifact.request` (docs/design/artifacts.md §5)."""
        self._control({"artifact_result": {"request_id": request_id, "result": result, "error": error}})

    def answer_summon(
        self, request_id: str, *, result: Any = None, error: Mapping[str, Any] | None = None
    ) -> None:
        """Answer a `summon.request` (docs/design/execution.md §8.6)."""
        self._control({"summon_result": {"request_id": request_id, "result": result, "error": error}})

    def answer_emit(
        self, request_id: str, event_id: str | None = None, error: Mapping[str, Any] | None = None
    ) -> None:
        """Answer an `event.emit` (after the orchestrator committed the event, or with an error)."""
        self._control({"emit_result": {"request_id": request_id, "event_id": event_id, "error": error}})

    def kill(self) -> None:
        """SIGKILL the runner and every process group it reported (its `start` stream then ends)."""
        self.kill_groups()

    def kill_groups(self) -> None:
        """SIGKILL every recorded group (the runner's own included); harmless when they are gone."""
        for pgid in self.groups:
            signal_group(pgid, signal.SIGKILL)


class ReadyRunner:
    """One runner started before its job (`--wait`: interpreter up, Conveyor imported, a step spare started).

    `take` hands it out; `start` makes the next one (the agent calls it once the job is past its setup, so
    the two do not compete for the CPU); one that died while waiting is replaced after a pause that
    grows while they keep dying (`REPLACE_BACKOFF_S`), so a broken interpreter cannot spin the agent.
    """

    REPLACE_BACKOFF_S = (0.0, 1.0, 5.0, 30.0)

    def __init__(
        self,
        *,
        python: str | None = None,
        env: Mapping[str, str] | None = None,
        venvs_dir: Path | None = None,
    ) -> None:
        self.python = python or sys.executable
        self.env = dict(os.environ if env is None else env)
        # Where the agent's requirements venvs live: the last job's venv interpreter is read from there.
        self.venvs_dir = venvs_dir
        self.process: asyncio.subprocess.Process | None = None
        self._ready = asyncio.Event()
        self._handover = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._deaths = 0
        self._stopped = False

    def _command(self) -> list[str]:
        command = [self.python, "-m", "conveyor.agent.runner", "--wait"]
        spare_python = remembered_interpreter(self.venvs_dir) if self.venvs_dir is not None else None
        if spare_python is not None:
            command += ["--spare-python", spare_python]
        return command

    @property
    def pid(self) -> int | None:
        """The waiting runner's pid, if one is waiting."""
        return None if self.process is None else self.process.pid

    def start(self) -> None:
        """Start keeping a runner ready (idempotent; after `stop`, nothing)."""
        if self._stopped:
            return
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._keep())

    async def _keep(self) -> None:
        while not self._stopped:
            delay = self.REPLACE_BACKOFF_S[min(self._deaths, len(self.REPLACE_BACKOFF_S) - 1)]
            if delay:
                await asyncio.sleep(delay)
            try:
                process = await spawn_runner(self._command(), self.env)
            except OSError:
                self._deaths += 1
                continue
            self.process = process
            self._ready.clear()
            self._handover.clear()
            assert process.stdout is not None
            try:
                line = await process.stdout.readline()
            except (ValueError, asyncio.LimitOverrunError):
                line = b""
            if is_ready_line(line):
                self._ready.set()
                self._deaths = 0
            # Wait until it is taken (then `process` is no longer ours) or it dies.
            exited = asyncio.ensure_future(process.wait())
            taken = asyncio.ensure_future(self._handover.wait())
            try:
                await asyncio.wait({exited, taken}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                exited.cancel()
                taken.cancel()
            if self.process is process:  # it died while waiting
                self.process = None
                self._ready.clear()
                self._deaths += 1
            else:
                return

    async def take(self, wait_s: float = 2.0) -> asyncio.subprocess.Process | None:
        """The ready runner if one is alive and ready (else None: start one yourself); `start` makes the next.

        One still importing is waited for (at most `wait_s`): it is further along than a new one.
        """
        process = self.process
        if process is not None and not self._ready.is_set() and process.returncode is None:
            if not await wait_event(self._ready, wait_s):
                return None
        if process is None or self.process is not process:
            return None
        if not self._ready.is_set() or process.returncode is not None:
            return None
        if process.stdout is None or process.stdout.at_eof():
            return None
        self.process = None
        self._ready.clear()
        self._handover.set()
        return process

    async def stop(self) -> None:
        """Stop keeping a runner ready and end the waiting one."""
        self._stopped = True
        process, self.process = self.process, None
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait({self._task})
        if process is not None and process.returncode is None:
            signal_group(process.pid, signal.SIGKILL)
            await process.wait()
