"""The agent program, `conveyor agent` (docs/design/execution.md §6–7).

It holds one connection to the orchestrator (`Connection`), accepts up to `capacity` jobs, runs each through
`JobProcess` (the runner child: the agent never imports user code) in `<home>/work/<job_id>/`, and turns the
runner's messages into protocol messages: `step.started` and `log` → `step.started` and `log.chunk` (sent
live); `step.finished`, `job.finished` and `event.emit` → the durable outbox first, then sent.

Stopping: `agent.drain` or SIGUSR1 → reject new work (`draining`), finish the running jobs, wait for the
outbox to empty (at most 30 s), close 1000 and exit 0. SIGTERM/SIGINT → the same, but running jobs are
cancelled gracefully (`agent_shutdown`) and the wait for acknowledgements is at most 10 s; a second signal
forces the cancel and skips the wait. `--ephemeral` → one job, then the same as a drain. A refused token
(4010), an unsupported protocol (4003) or a replacement by a newer connection (4008) → exit 3.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import shutil
import signal
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pydantic

from conveyor.agent.cache_store import DEFAULT_MAX_BYTES as DEFAULT_CACHE_MAX_BYTES
from conveyor.agent.connection import Connection, ConnectionSettings
from conveyor.agent.container_plan import AGENT_ID_VARIABLE, engine_address, engine_may_answer
from conveyor.agent.identity import agent_labels, host_info, load_agent_id
from conveyor.agent.mirror import DEFAULT_MAX_BYTES as DEFAULT_MIRROR_MAX_BYTES
from conveyor.agent.outbox import Outbox
from conveyor.agent.process import JobProcess, ReadyRunner
from conveyor.agent.signals import signal_group
from conveyor.agent.spec import JobSpec
from conveyor.heap import freeze_startup_heap
from conveyor.model import protocol as p
from conveyor.version import VERSION

log = logging.getLogger(__name__)

RUNNING_FILE = "running.json"
SHUTDOWN_ACK_WAIT_S = 10.0
DRAIN_ACK_WAIT_S = 30.0
FORCE_WAIT_S = 5.0
KEEP_ON = ("failed", "timed_out")


@dataclass
class AgentOptions:
    """What `conveyor agent` was told (flags and environment)."""

    url: str
    token: str
    home: Path
    labels: list[str] = field(default_factory=list)
    capacity: int = 1
    agent_id: str | None = None
    ephemeral: bool = False
    keep_workspace: bool = False
    heartbeat_s: float | None = None  # None: what the orchestrator says (15 s)
    dead_after_s: float = 45.0
    python: str | None = None  # the runner's interpreter (default: this one)
    mirror_max_bytes: int = DEFAULT_MIRROR_MAX_BYTES  # <home>/mirrors in total; 0: no mirrors
    cache_max_bytes: int = DEFAULT_CACHE_MAX_BYTES  # <home>/caches in total; 0: no local cache entries


@dataclass
class RunningJob:
    """One accepted job and its runner."""

    job_id: str
    spec: JobSpec
    process: JobProcess
    workspace: Path
    # The `job.dispatch` attempt this execution began with: its log chunks and its result name it, so the
    # orchestrator keeps them apart from another execution's of the same job (docs/design/execution.md §9).
    attempt: int = 1
    step_index: int | None = None
    status: str | None = None
    task: asyncio.Task[None] | None = None
    # The job's artifact credential (docs/design/artifacts.md §4): kept here, never given to the runner.
    artifact_token: str | None = None
    digest_first: bool = False
    direct_downloads: bool = False
    transfers: set[asyncio.Task[None]] = field(default_factory=set)


def runner_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The runner's environment: the agent's, without its own `CONVEYOR_AGENT_*` settings (the token)."""
    return {name: value for name, value in environ.items() if not name.upper().startswith("CONVEYOR_AGENT_")}


def spec_from_dispatch(dispatch: p.JobDispatch) -> JobSpec:
    """`job.dispatch` → the runner's `JobSpec` (display name and matrix are lifted out of `job`)."""
    document = dispatch.model_dump(mode="json", exclude={"type", "artifacts"})
    document["local"] = False
    return JobSpec.model_validate(document)


def _fields(model: type[p.Message], message: Mapping[str, Any]) -> dict[str, Any]:
    """The runner message's fields the protocol model knows (the runner adds e.g. `lock_index`)."""
    return {name: value for name, value in message.items() if name in model.model_fields}


def _stderr_logger(job_id: str) -> Callable[[str], None]:
    """Runner stderr goes to the agent's log (docs/design/execution.md: "the setup log")."""

    def write(line: str) -> None:
        log.info("runner %s: %s", job_id, line)

    return write


def _now_ms() -> int:
    return int(time.time() * 1000)


async def _first(*events: asyncio.Event, timeout: float | None = None) -> bool:
    """Wait until one of `events` is set (at most `timeout` seconds); whether the first one is set."""
    waiters = {asyncio.ensure_future(event.wait()) for event in events}
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
    return events[0].is_set()


class Agent:
    """The agent: a `Session` for the connection, and the jobs it runs."""

    def __init__(
        self,
        options: AgentOptions,
        *,
        environ: Mapping[str, str] | None = None,
        rng: random.Random | None = None,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    ) -> None:
        self.options = options
        self.home = options.home
        self.home.mkdir(parents=True, exist_ok=True)
        self.agent_id = load_agent_id(self.home, options.agent_id)
        self.labels = agent_labels(options.labels)
        self.capacity = max(1, options.capacity)
        self.environ = dict(os.environ if environ is None else environ)
        self.outbox = Outbox(self.home)
        self.connection = Connection(
            ConnectionSettings(
                url=options.url,
                token=options.token,
                version=VERSION,
                heartbeat_s=options.heartbeat_s,
                dead_after_s=options.dead_after_s,
            ),
            self.outbox,
            self,
            rng=rng,
            sleep=sleep,
        )
        self.jobs: dict[str, RunningJob] = {}
        self.ready_runner = ReadyRunner(
            python=options.python, env=self._runner_env(), venvs_dir=self.home / "venvs"
        )
        self.emits: dict[str, RunningJob] = {}
        self.draining = False
        self.shutting_down = False
        self.took_job = False  # ephemeral: the one job was accepted
        self._forced = asyncio.Event()
        self._outbox_empty = asyncio.Event()
        self._jobs_idle = asyncio.Event()
        self._jobs_idle.set()
        self._winding_down: asyncio.Task[None] | None = None
        self._signals = 0
        self._update_outbox_event()

    def _runner_env(self) -> dict[str, str]:
        """A runner's environment, with the id its job resources are labelled with (docs/design/containers.md §5)."""
        return {**runner_environment(self.environ), AGENT_ID_VARIABLE: self.agent_id}

    async def _sweep_job_resources(self) -> None:
        """Remove the containers and networks jobs of this agent's previous life left (docs/design/containers.md §5)."""
        engine = engine_address(self.environ)
        if not engine_may_answer(engine):
            return  # no engine on this host: nothing can have been left there
        # Imported here: an agent on a host without an engine never loads aiodocker.
        from conveyor.agent.containers import sweep

        try:
            containers, networks = await sweep(engine, self.agent_id)
        except Exception as problem:  # an engine that does not answer must not stop the agent
            log.warning("sweeping job containers at %s failed: %r", engine, problem)
            return
        if containers or networks:
            log.warning(
                "removed %d container(s) and %d network(s) left by jobs of this agent's previous run",
                containers,
                networks,
            )

    # -- entry point --------------------------------------------------------------------------------

    async def run(self) -> int:
        """Serve until an exit is decided; the exit code (0, or 3 when the orchestrator refused us)."""
        self._kill_leftovers()
        await self._sweep_job_resources()
        self.ready_runner.start()
        freeze_startup_heap()
        loop = asyncio.get_running_loop()
        installed: list[int] = []
        for signum, handler in (
            (signal.SIGTERM, self._on_stop_signal),
            (signal.SIGINT, self._on_stop_signal),
            (getattr(signal, "SIGUSR1", None), self._on_drain_signal),
        ):
            if signum is None:
                continue
            try:
                loop.add_signal_handler(signum, handler)
                installed.append(signum)
            except (NotImplementedError, RuntimeError, ValueError):
                pass
        log.info(
            "agent %s starting: %s, capacity %d, labels %s%s",
            self.agent_id,
            self.options.url,
            self.capacity,
            ", ".join(self.labels),
            ", ephemeral" if self.options.ephemeral else "",
        )
        try:
            code = await self.connection.run()
        finally:
            for signum in installed:
                loop.remove_signal_handler(signum)
            await self.ready_runner.stop()
        if self.jobs:
            # Exiting with jobs still running (refused, or forced): stop them and record their ends.
            await self._stop_jobs(force=True, reason="agent_shutdown")
        if self._winding_down is not None and not self._winding_down.done():
            self._winding_down.cancel()
        log.info("agent %s exiting with %d", self.agent_id, code)
        return code

    # -- Session ------------------------------------------------------------------------------------

    def register_message(self) -> p.AgentRegister:
        """`agent.register` with the jobs running here and those whose statuses await an ack."""
        return p.AgentRegister(
            agent_id=self.agent_id,
            labels=self.labels,
            capacity=self.capacity,
            in_flight=[
                p.InFlight(job_id=job.job_id, step_index=job.step_index) for job in self.jobs.values()
            ],
            unacked_jobs=self.outbox.unacked_jobs(),
            host=host_info(),
            version=VERSION,
            ephemeral=self.options.ephemeral,
        )

    def heartbeat_message(self, ts_ms: float) -> p.Heartbeat:
        """`heartbeat`: running jobs, free slots, draining."""
        free = 0 if not self.accepting else max(0, self.capacity - len(self.jobs))
        return p.Heartbeat(ts=ts_ms, running=list(self.jobs), free_slots=free, draining=self.draining)

    def close_state(self) -> tuple[bool, bool, bool]:
        """(draining, ephemeral, idle) for the close-code table."""
        return self.draining or self.shutting_down, self.options.ephemeral, not self.jobs

    async def on_message(self, message: p.OrchestratorMessage) -> None:
        """One orchestrator message."""
        if isinstance(message, p.JobDispatch):
            await self._on_dispatch(message)
        elif isinstance(message, p.StatusAck):
            if not self.outbox.ack(message.oseq):
                log.debug("status.ack for oseq %d that is not pending", message.oseq)
            self._update_outbox_event()
        elif isinstance(message, p.EventEmitResult):
            self.outbox.ack_emit(message.request_id)
            self._update_outbox_event()
            job = self.emits.pop(message.request_id, None)
            if job is not None:
                error = message.error.model_dump() if message.error is not None else None
                job.process.answer_emit(message.request_id, event_id=message.event_id, error=error)
        elif isinstance(message, p.JobCancel):
            job = self.jobs.get(message.job_id)
            if job is None:
                log.info("job.cancel for %s, which is not running here", message.job_id)
            else:
                log.info(
                    "cancelling job %s (%s%s)", job.job_id, message.reason, ", force" if message.force else ""
                )
                job.process.cancel(force=message.force, reason=message.reason or None)
        elif isinstance(message, p.AgentDrain):
            log.info("drain requested by the orchestrator: %s", message.reason or "no reason given")
            self.drain()
        # heartbeat.ack and stray handshake messages need nothing.

    # -- accepting work -----------------------------------------------------------------------------

    @property
    def accepting(self) -> bool:
        """Whether new jobs are taken at all (not draining, not stopping, ephemeral not used up)."""
        return not (self.draining or self.shutting_down or (self.options.ephemeral and self.took_job))

    async def _on_dispatch(self, dispatch: p.JobDispatch) -> None:
        job_id = dispatch.job_id
        if job_id in self.jobs:
            await self.connection.send(p.JobAck(re=dispatch.id, job_id=job_id))
            return
        reason: str | None = None
        detail = ""
        spec: JobSpec | None = None
        if not self.accepting:
            reason, detail = "draining", "the agent is not taking new jobs"
        elif len(self.jobs) >= self.capacity:
            reason, detail = "busy", f"running {len(self.jobs)} of {self.capacity} jobs"
        elif not job_id or "/" in job_id or job_id in (".", "..") or "\0" in job_id:
            reason, detail = "unsupported", f"unusable job id {job_id!r}"
        else:
            try:
                spec = spec_from_dispatch(dispatch)
            except pydantic.ValidationError as error:
                reason, detail = "unsupported", f"cannot read the job: {error.errors()[0]}"[:500]
        if reason is not None or spec is None:
            log.info("rejecting job %s: %s (%s)", job_id, reason, detail)
            await self.connection.send(
                p.JobReject(re=dispatch.id, job_id=job_id, reason=reason or "unsupported", detail=detail)
            )
            return
        job = RunningJob(
            job_id=job_id,
            spec=spec,
            process=JobProcess(
                python=self.options.python,
                venvs_dir=self.home / "venvs",
                env=self._runner_env(),
                on_stderr=_stderr_logger(job_id),
                mirrors_dir=self.home / "mirrors" if self.options.mirror_max_bytes > 0 else None,
                mirror_max_bytes=self.options.mirror_max_bytes,
            ),
            workspace=self.home / "work" / job_id,
            attempt=dispatch.attempt,
            artifact_token=dispatch.artifacts.token if dispatch.artifacts else None,
            digest_first=dispatch.artifacts.digest_first if dispatch.artifacts else False,
            direct_downloads=dispatch.artifacts.direct_downloads if dispatch.artifacts else False,
        )
        self.jobs[job_id] = job
        self._jobs_idle.clear()
        if self.options.ephemeral:
            self.took_job = True
        log.info("accepted job %s (%s)", job_id, spec.name)
        await self.connection.send(p.JobAck(re=dispatch.id, job_id=job_id))
        job.task = asyncio.create_task(self._run_job(job))

    # -- running a job ------------------------------------------------------------------------------

    async def _run_job(self, job: RunningJob) -> None:
        finished = False
        try:
            await self.connection.send(p.JobStarted(job_id=job.job_id, ts=_now_ms()))
            ready = await self.ready_runner.take()
            async for message in job.process.start(job.spec, job.workspace, ready=ready):
                kind = message.get("type")
                if kind == "job.finished":
                    finished = True
                await self._on_runner_message(job, message)
                if kind == "job.finished" or (kind == "step.started" and message.get("kind") != "setup"):
                    # The next runner starts once this job is past its setup, so the two never compete
                    # for the CPU on the way to a first step; and after the step's start is sent, so
                    # starting it does not delay that message.
                    self._keep_runner_ready()
        except Exception as error:  # the agent survives whatever happens to one job
            log.exception("job %s: the runner could not be run", job.job_id)
            job.process.kill()
            if not finished:
                await self._durable_job_finished(
                    job,
                    {
                        "job_id": job.job_id,
                        "status": "failed",
                        "reason": "runner_crashed",
                        "outputs": {},
                        "duration_ms": 0,
                        "error": f"the agent could not run the job: {error}",
                    },
                )
        finally:
            self._keep_runner_ready()
            self.jobs.pop(job.job_id, None)
            for request_id in [r for r, owner in self.emits.items() if owner is job]:
                del self.emits[request_id]
            self._write_running()
            self._remove_workspace(job)
            if not self.jobs:
                self._jobs_idle.set()
            log.info("job %s finished: %s", job.job_id, job.status)
            if self.options.ephemeral:
                self._wind_down(DRAIN_ACK_WAIT_S)
            elif self.draining and not self.jobs:
                self._wind_down(DRAIN_ACK_WAIT_S)

    def _keep_runner_ready(self) -> None:
        # An ephemeral agent runs one job: no runner is kept ready after it.
        if self.accepting:
            self.ready_runner.start()

    async def _on_runner_message(self, job: RunningJob, message: Mapping[str, Any]) -> None:
        kind = message.get("type")
        if kind == "proc":
            self._write_running()
        elif kind == "step.started":
            job.step_index = int(message["step_index"])
            await self.connection.send(p.StepStarted.model_validate({**_fields(p.StepStarted, message)}))
        elif kind == "log":
            lines = [_fields(p.LogLine, line) for line in message.get("lines", [])]
            chunk = p.LogChunk(
                job_id=job.job_id,
                step_index=message["step_index"],
                seq=message["seq"],
                lines=lines,
                attempt=job.attempt,
            )
            await self.connection.send(chunk)
        elif kind == "step.finished":
            await self._durable(p.StepFinished, {**message, "job_id": job.job_id})
        elif kind == "event.emit":
            request_id = str(message["request_id"])
            self.emits[request_id] = job
            await self._durable(p.EventEmit, {**message, "job_id": job.job_id})
        elif kind == "artifact.request":
            # The step asking is the one started last (a job's steps run one at a time, and the runner's
            # messages arrive in order): its cache lookups and saves are recorded against it for the run page
            # (docs/design/caches.md §7).
            message = {**message, "step_index": job.step_index}
            task = asyncio.create_task(self._artifact_request(job, message))
            job.transfers.add(task)
            task.add_done_callback(job.transfers.discard)
        elif kind == "summon.request":
            task = asyncio.create_task(self._summon_request(job, message))
            job.transfers.add(task)
            task.add_done_callback(job.transfers.discard)
        elif kind == "job.finished":
            await self._durable_job_finished(job, message)

    async def _summon_request(self, job: RunningJob, message: Mapping[str, Any]) -> None:
        """Start (and maybe wait for) a step's summoned run with the job's credential; answer the step either
        way (docs/design/execution.md §8.6)."""
        from conveyor.agent.summon import SummonClient, SummonFailed
        from conveyor.agent.transfer import http_base

        request_id = str(message.get("request_id"))
        if job.artifact_token is None:
            job.process.answer_summon(
                request_id,
                error={"code": "unavailable", "detail": "the orchestrator sent no job credential"},
            )
            return
        client = SummonClient(http_base(self.options.url), job.artifact_token, job.job_id)
        try:
            result = await client.handle(message)
        except SummonFailed as failure:
            job.process.answer_summon(request_id, error=failure.as_error())
        except Exception as error:  # the agent survives whatever one summon meets
            log.exception("job %s: summon failed", job.job_id)
            job.process.answer_summon(request_id, error={"code": "agent_error", "detail": str(error)})
        else:
            job.process.answer_summon(request_id, result=result)

    async def _artifact_request(self, job: RunningJob, message: Mapping[str, Any]) -> None:
        """Move a step's artifact bytes with the job's credential; answer the step either way."""
        from conveyor.agent.transfer import ArtifactClient, ArtifactRequestFailed, http_base

        request_id = str(message.get("request_id"))
        if job.artifact_token is None:
            job.process.answer_artifact(
                request_id, error="artifacts are not available here (the orchestrator sent no credential)"
            )
            return
        from conveyor.agent.cache_store import EntryStore

        entries = (
            EntryStore(self.home / "caches", self.options.cache_max_bytes)
            if self.options.cache_max_bytes > 0
            else None
        )
        client = ArtifactClient(
            http_base(self.options.url),
            job.artifact_token,
            job.job_id,
            entries=entries,
            digest_first=job.digest_first,
            direct_downloads=job.direct_downloads,
        )
        try:
            result = await client.handle(message)
        except ArtifactRequestFailed as error:
            job.process.answer_artifact(request_id, error=str(error))
        except Exception as error:  # the agent survives whatever one transfer meets
            log.exception("job %s: artifact request failed", job.job_id)
            job.process.answer_artifact(request_id, error=f"artifact {message.get('op')}: {error}")
        else:
            job.process.answer_artifact(request_id, result=result)

    async def _durable_job_finished(self, job: RunningJob, message: Mapping[str, Any]) -> None:
        job.status = str(message.get("status"))
        try:
            await self._durable(p.JobFinished, {**message, "job_id": job.job_id, "attempt": job.attempt})
        except pydantic.ValidationError as error:
            log.error("job %s: unreadable job.finished from the runner: %s", job.job_id, error)
            job.status = "failed"
            await self._durable(
                p.JobFinished,
                {
                    "job_id": job.job_id,
                    "status": "failed",
                    "reason": "runner_crashed",
                    "outputs": {},
                    "error": "the runner reported an unreadable job.finished",
                    "attempt": job.attempt,
                },
            )

    async def _durable(self, model: type[p.Message], message: Mapping[str, Any]) -> None:
        """Validate, append to the outbox (fsync), then send: the order docs/design/execution.md §6
        requires."""
        fields = _fields(model, message)
        fields.pop("oseq", None)
        checked = model.model_validate({**fields, "oseq": 0}).model_dump(mode="json", exclude={"oseq"})
        entry = self.outbox.append(checked)
        self._outbox_empty.clear()
        await self.connection.send_durable(entry)

    def _update_outbox_event(self) -> None:
        if len(self.outbox) == 0:
            self._outbox_empty.set()
        else:
            self._outbox_empty.clear()

    # -- home bookkeeping ---------------------------------------------------------------------------

    def _write_running(self) -> None:
        """`running.json`: the process groups of live runners and steps (killed at the next start)."""
        document = {
            "pid": os.getpid(),
            "jobs": {job.job_id: sorted(job.process.groups) for job in self.jobs.values()},
        }
        path = self.home / RUNNING_FILE
        temporary = path.with_name(RUNNING_FILE + ".tmp")
        temporary.write_text(json.dumps(document), encoding="utf-8")
        os.replace(temporary, path)

    def _kill_leftovers(self) -> None:
        """After a crash: SIGKILL the process groups the previous agent recorded, drop stale workspaces."""
        path = self.home / RUNNING_FILE
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            document = {}
        except (ValueError, OSError):
            log.warning("ignoring an unreadable %s", path)
            document = {}
        for job_id, groups in (document.get("jobs") or {}).items():
            for pgid in groups:
                if isinstance(pgid, int) and pgid > 1 and pgid != os.getpgrp():
                    log.warning("killing process group %d left by job %s", pgid, job_id)
                    signal_group(pgid, signal.SIGKILL)
        path.unlink(missing_ok=True)
        work = self.home / "work"
        if work.is_dir() and not self.options.keep_workspace:
            for leftover in work.iterdir():
                shutil.rmtree(leftover, ignore_errors=True)

    def _remove_workspace(self, job: RunningJob) -> None:
        if self.options.keep_workspace and job.status in KEEP_ON:
            log.info("keeping the workspace of job %s at %s", job.job_id, job.workspace)
            return
        shutil.rmtree(job.workspace, ignore_errors=True)

    # -- stopping -----------------------------------------------------------------------------------

    def drain(self) -> None:
        """Reject new work, finish running jobs, wait for the outbox, then close 1000 and exit 0."""
        self.draining = True
        if not self.jobs:
            self._wind_down(DRAIN_ACK_WAIT_S)

    def shutdown(self) -> None:
        """SIGTERM/SIGINT: stop accepting, cancel running jobs gracefully, wait ≤ 10 s for acks, exit 0."""
        self.shutting_down = True
        for job in list(self.jobs.values()):
            job.process.cancel(force=False, reason="agent_shutdown")
        self._wind_down(SHUTDOWN_ACK_WAIT_S, restart=True)

    def force(self) -> None:
        """A second signal: force-cancel running jobs and skip the wait for acknowledgements."""
        self._forced.set()
        for job in list(self.jobs.values()):
            job.process.cancel(force=True, reason="agent_shutdown")

    def _on_stop_signal(self) -> None:
        self._signals += 1
        if self._signals == 1:
            log.info("stopping: cancelling running jobs (a second signal forces)")
            self.shutdown()
        else:
            log.info("forced stop")
            self.force()

    def _on_drain_signal(self) -> None:
        log.info("SIGUSR1: draining")
        self.drain()

    def _wind_down(self, ack_wait_s: float, restart: bool = False) -> None:
        if self._winding_down is not None and not self._winding_down.done():
            if not restart:
                return
            self._winding_down.cancel()
        self._winding_down = asyncio.create_task(self._finish(ack_wait_s))

    async def _finish(self, ack_wait_s: float) -> None:
        """Wait for the jobs, then (unless forced) for the outbox to empty, then stop with 0."""
        while not self._jobs_idle.is_set() and not self._forced.is_set():
            await _first(self._jobs_idle, self._forced)
        if not self._jobs_idle.is_set():  # forced: the runners got `cancel {force}`; then SIGKILL
            if not await _first(self._jobs_idle, timeout=FORCE_WAIT_S):
                for job in list(self.jobs.values()):
                    job.process.kill()
                await _first(self._jobs_idle, timeout=FORCE_WAIT_S)
        if not self._forced.is_set():
            await _first(self._outbox_empty, self._forced, timeout=ack_wait_s)
        if len(self.outbox):
            log.warning(
                "exiting with %d unacknowledged outbox entries (kept in %s)", len(self.outbox), self.home
            )
        await self.connection.stop(0)

    async def _stop_jobs(self, *, force: bool, reason: str) -> None:
        for job in list(self.jobs.values()):
            job.process.cancel(force=force, reason=reason)
        tasks = {job.task for job in self.jobs.values() if job.task is not None}
        if tasks:
            await asyncio.wait(tasks, timeout=FORCE_WAIT_S)
        for job in list(self.jobs.values()):
            job.process.kill()
        tasks = {job.task for job in self.jobs.values() if job.task is not None}
        if tasks:
            await asyncio.wait(tasks, timeout=FORCE_WAIT_S)
