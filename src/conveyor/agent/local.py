"""`conveyor run local`: run matched jobs on this machine with the agent's runner
(docs/design/authoring.md §6).

Each job gets a fresh workspace `$TMPDIR/conveyor-local/<run-id>/<job-slug>/` whose `src` is a shared clone of
HEAD with the working tree laid over it (modified and untracked files copied, deleted files removed), so the
repository itself is never touched. Jobs run in needs order with the same `JobProcess` an agent uses.
"""

from __future__ import annotations

import asyncio
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from conveyor.agent.process import JobProcess
from conveyor.agent.spec import JobSpec, RunContext, UpstreamResult, WorkflowRef
from conveyor.lockfile.models import JobEntry, WorkflowEntry
from conveyor.matching.event import Event
from conveyor.matching.labels import labels_satisfy
from conveyor.matching.plan import PlannedJob
from conveyor.model.needs import NeedMember, need_result
from conveyor.model.states import aggregate_status

TERMINAL_OK = ("success", "skipped")
_SECTION_RE = re.compile(r"^\[([^\]]+)\]$")


def parse_secrets_file(text: str) -> dict[str | None, dict[str, str]]:
    """`NAME=value` lines, `[environment]` sections and `#` comments; key None holds the org-level ones."""
    sections: dict[str | None, dict[str, str]] = {None: {}}
    current: str | None = None
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if found := _SECTION_RE.match(line):
            current = found.group(1).strip()
            sections.setdefault(current, {})
            continue
        name, separator, value = raw.partition("=")
        if not separator or not name.strip():
            raise ValueError(f"secrets file line {number}: expected NAME=value")
        sections.setdefault(current, {})[name.strip()] = value
    return sections


def job_secrets(
    sections: Mapping[str | None, Mapping[str, str]], environment: str | None, overrides: Mapping[str, str]
) -> dict[str, str]:
    """Org-level secrets ∪ the environment's (the environment wins), then `--secret` values."""
    values = dict(sections.get(None, {}))
    if environment is not None:
        values.update(sections.get(environment, {}))
    values.update(overrides)
    return values


def local_labels(extra: Iterable[str] = ()) -> list[str]:
    """The automatic labels an agent on this host reports, plus `--label` values."""
    system = platform.system().lower()
    os_label = {"darwin": "macos", "windows": "windows"}.get(system, "linux")
    machine = platform.machine().lower()
    arch = {"amd64": "x86_64", "x64": "x86_64", "aarch64": "arm64"}.get(machine, machine)
    host = socket.gethostname().lower()
    return [
        f"conveyor:os:{os_label}",
        f"conveyor:arch:{arch}",
        f"conveyor:host:{host}",
        *(x.lower() for x in extra),
    ]


def _git(root: Path, *args: str) -> str:
    completed = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True)
    return completed.stdout


def _paths(output: str) -> list[str]:
    return [item for item in output.split("\0") if item]


def prepare_source(root: Path, destination: Path) -> None:
    """A shared clone of HEAD at `destination`, detached, with the working tree's changes laid over it."""
    head = subprocess.run(
        ["git", "rev-parse", "-q", "--verify", "HEAD^{commit}"], cwd=root, capture_output=True, text=True
    ).stdout.strip()
    if head:
        subprocess.run(
            ["git", "clone", "-q", "--shared", "--no-checkout", str(root), str(destination)],
            check=True,
            capture_output=True,
        )
        _git(destination, "checkout", "-q", "--detach", head)
        changed = _paths(_git(root, "diff", "--name-only", "-z", "HEAD"))
    else:
        destination.mkdir(parents=True)
        changed = _paths(_git(root, "ls-files", "-z", "--cached"))
    changed += _paths(_git(root, "ls-files", "-z", "--others", "--exclude-standard"))
    for relative in sorted(set(changed)):
        source, target = root / relative, destination / relative
        if source.is_file() or source.is_symlink():
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.is_symlink() or target.exists():
                target.unlink()
            shutil.copy2(source, target, follow_symlinks=False)
        elif target.is_file() or target.is_symlink():
            target.unlink()


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-")[:80] or "job"


@dataclass
class LocalJob:
    """One planned job of a local run and what became of it."""

    workflow: WorkflowEntry
    planned: PlannedJob
    entry: JobEntry
    status: str | None = None
    reason: str | None = None
    error: str | None = None
    outputs: dict[str, Any] = field(default_factory=dict)
    steps: list[dict[str, Any]] = field(default_factory=list)
    duration_ms: int = 0

    @property
    def label(self) -> str:
        """How log lines and the summary name the job."""
        return self.planned.display

    @property
    def failed_steps(self) -> list[str]:
        """Names of steps that did not succeed (skipped ones excluded)."""
        return [s["name"] for s in self.steps if s["status"] not in ("success", "skipped")]


class Reporter(Protocol):
    """What a local run tells the user; the CLI prints it as text or JSON lines."""

    def log(self, job: LocalJob, step: str, stream: str, text: str) -> None:
        """One log line of a step."""

    def step(self, job: LocalJob, message: Mapping[str, Any]) -> None:
        """A `step.started` or `step.finished` message."""

    def job(self, job: LocalJob) -> None:
        """A job reached its final status."""

    def event(self, job: LocalJob, name: str, payload: Any) -> None:
        """A step emitted an event (recorded, not delivered)."""


@dataclass
class LocalOptions:
    """The `run local` flags that shape execution."""

    secrets: Mapping[str | None, Mapping[str, str]] = field(default_factory=dict)
    secret_overrides: Mapping[str, str] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    labels: list[str] = field(default_factory=list)
    ignore_labels: bool = False
    concurrency: int = 1
    in_place: bool = False
    keep: bool = False
    work_root: Path | None = None
    venvs_dir: Path | None = None
    # `ctx.cache` entries, shared by local runs (docs/design/caches.md §5); None: caches always miss.
    cache_dir: Path | None = None
    runner_env: Mapping[str, str] | None = None


class LocalRun:
    """Runs the selected jobs of matched workflows in needs order; `cancel` stops them (twice: force)."""

    def __init__(
        self, root: Path, event: Event, jobs: list[LocalJob], options: LocalOptions, reporter: Reporter
    ) -> None:
        self.root = root
        self.event = event
        self.jobs = jobs
        self.options = options
        self.reporter = reporter
        self.run_id = f"local-{uuid.uuid4().hex[:12]}"
        base = options.work_root or Path(tempfile.gettempdir()) / "conveyor-local"
        self.directory = base / self.run_id
        self.processes: dict[int, JobProcess] = {}
        self.cancelled = False
        self.forced = False

    def cancel(self) -> None:
        """First call: graceful cancel of running jobs, nothing new starts; second call: force."""
        self.forced = self.cancelled
        self.cancelled = True
        for process in self.processes.values():
            process.cancel(force=self.forced, reason="interrupted")

    async def run(self) -> list[LocalJob]:
        """Run everything; returns the jobs with their final status."""
        semaphore = asyncio.Semaphore(1 if self.options.in_place else max(1, self.options.concurrency))
        if any(job.entry.container is not None or job.entry.services for job in self.jobs):
            await self._sweep_leftovers()
        pending = list(self.jobs)
        running: dict[asyncio.Task[None], LocalJob] = {}
        try:
            while pending or running:
                for job in list(pending):
                    verdict = self._readiness(job)
                    if verdict is None:
                        continue
                    pending.remove(job)
                    if verdict != "ready":
                        job.status, job.reason = "skipped", verdict
                        if self.cancelled:
                            job.status, job.reason = "cancelled", "interrupted"
                        self.reporter.job(job)
                        continue
                    running[asyncio.create_task(self._run_job(job, semaphore))] = job
                if not running:
                    if pending:  # needs that can never be met (should not happen with a valid lock)
                        for job in pending:
                            job.status, job.reason = "skipped", "needs: unsatisfiable"
                            self.reporter.job(job)
                        pending.clear()
                    break
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    running.pop(task)
                    task.result()
        finally:
            if not self.options.keep:
                shutil.rmtree(self.directory, ignore_errors=True)
        return self.jobs

    def _readiness(self, job: LocalJob) -> str | None:
        """None while upstreams run; `ready`; or the skip reason."""
        if self.cancelled and job.planned.job != "__hooks__":
            return "cancelled"
        for upstream_name, run_on in job.planned.needs:
            upstream = [j for j in self.jobs if j.workflow is job.workflow and j.planned.job == upstream_name]
            if not upstream:
                continue  # not selected with --job: treated as satisfied
            if any(j.status is None for j in upstream):
                return None
            status = aggregate_status(j.status or "skipped" for j in upstream) or "skipped"
            if status not in run_on:
                return f"needs: {upstream_name} {status}"
        if not self.options.ignore_labels and not labels_satisfy(job.planned.runs_on, self.options.labels):
            return "runs_on_unsatisfiable_locally"
        return "ready"

    def _upstream(self, job: LocalJob) -> dict[str, UpstreamResult]:
        result: dict[str, UpstreamResult] = {}
        for upstream_name, _ in job.planned.needs:
            combos = [j for j in self.jobs if j.workflow is job.workflow and j.planned.job == upstream_name]
            if not combos:
                continue
            # The same `ctx.needs` an agent gets from the orchestrator (model.needs).
            members = [
                NeedMember(c.planned.matrix_key or "", c.status or "skipped", c.outputs) for c in combos
            ]
            need = need_result(members)
            if need is not None:
                result[upstream_name] = UpstreamResult.model_validate(need)
        return result

    def _spec(self, job: LocalJob) -> JobSpec:
        workflow = job.workflow
        return JobSpec(
            job_id=f"{self.run_id}-{_slug(workflow.name + '-' + job.label)}",
            run_id=self.run_id,
            workflow=WorkflowRef.of(workflow),
            job=job.entry,
            display_name=job.label,
            matrix=job.planned.matrix,
            environment=job.planned.environment,
            env=dict(self.options.env),
            secrets=job_secrets(self.options.secrets, job.planned.environment, self.options.secret_overrides),
            upstream=self._upstream(job),
            context=RunContext(event=self.event.model_dump(mode="json"), run_id=self.run_id),
            local=True,
        )

    async def _sweep_leftovers(self) -> None:
        """Remove the containers and networks earlier local runs on this host left when they were killed
        (docs/design/containers.md §5): their runners are gone, so nothing of theirs is in use."""
        from conveyor.agent.container_plan import engine_address, engine_may_answer

        engine = engine_address(os.environ if self.options.runner_env is None else self.options.runner_env)
        if not engine_may_answer(engine):
            return  # the job that needs the engine says so
        from conveyor.agent.containers import sweep_local

        try:
            containers, networks = await sweep_local(engine, socket.gethostname())
        except Exception as problem:  # an engine that does not answer fails the container job, not this
            print(
                f"conveyor: sweeping earlier local runs' containers at {engine}: {problem!r}", file=sys.stderr
            )
            return
        if containers or networks:
            print(
                f"conveyor: removed {containers} container(s) and {networks} network(s) earlier local runs left",
                file=sys.stderr,
            )

    async def _run_job(self, job: LocalJob, semaphore: asyncio.Semaphore) -> None:
        async with semaphore:
            if self.cancelled and job.planned.job != "__hooks__":
                job.status, job.reason = "cancelled", "interrupted"
                self.reporter.job(job)
                return
            workspace = self.directory / _slug(f"{job.workflow.name}-{job.label}")
            await asyncio.to_thread(self._prepare, workspace)
            process = JobProcess(venvs_dir=self.options.venvs_dir, env=self.options.runner_env)
            self.processes[id(job)] = process
            if self.cancelled:
                process.cancel(force=self.forced, reason="interrupted")
            names: dict[int, str] = {}
            try:
                async for message in process.start(self._spec(job), workspace):
                    self._handle(job, process, names, message)
            finally:
                self.processes.pop(id(job), None)
            self.reporter.job(job)

    def _prepare(self, workspace: Path) -> None:
        workspace.mkdir(parents=True, exist_ok=True)
        if self.options.in_place:
            os.symlink(self.root, workspace / "src", target_is_directory=True)
        else:
            prepare_source(self.root, workspace / "src")

    def _handle(
        self, job: LocalJob, process: JobProcess, names: dict[int, str], message: dict[str, Any]
    ) -> None:
        kind = message["type"]
        if kind == "step.started":
            names[message["step_index"]] = message["name"]
            self.reporter.step(job, message)
        elif kind == "log":
            name = names.get(message["step_index"], str(message["step_index"]))
            for line in message["lines"]:
                self.reporter.log(job, name, line["stream"], line["text"])
        elif kind == "step.finished":
            names[message["step_index"]] = message["name"]
            job.steps.append(message)
            self.reporter.step(job, message)
        elif kind == "event.emit":
            self.reporter.event(job, message["name"], message.get("payload"))
            process.answer_emit(message["request_id"], event_id=f"local-event-{uuid.uuid4().hex[:12]}")
        elif kind == "summon.request":  # no orchestrator to start a run (docs/design/authoring.md §2.5)
            process.answer_summon(
                message["request_id"],
                error={"code": "local", "detail": "runs cannot be summoned under `conveyor run local`"},
            )
        elif kind == "artifact.request" and str(message.get("op", "")).startswith("cache."):
            self._cache_request(process, message)
        elif kind == "artifact.request":
            from conveyor.agent.local_artifacts import LocalArtifactError, LocalArtifacts

            try:
                result = LocalArtifacts(self.directory / "artifacts").handle(job.label, message)
            except (LocalArtifactError, OSError) as error:
                process.answer_artifact(message["request_id"], error=str(error))
            else:
                process.answer_artifact(message["request_id"], result=result)
        elif kind == "job.finished":
            job.status, job.reason, job.error = message["status"], message.get("reason"), message.get("error")
            job.outputs = message.get("outputs") or {}
            job.duration_ms = int(message.get("duration_ms") or 0)

    def _cache_request(self, process: JobProcess, message: dict[str, Any]) -> None:
        from conveyor.agent.local_caches import LocalCacheError, LocalCaches
        from conveyor.model.caches import readable_scopes

        if self.options.cache_dir is None:
            process.answer_artifact(message["request_id"], error="no local cache directory")
            return
        caches = LocalCaches(self.options.cache_dir, readable_scopes(self.event.model_dump(mode="json")))
        try:
            result = caches.handle(message)
        except (LocalCacheError, OSError, ValueError) as error:
            process.answer_artifact(message["request_id"], error=str(error))
        else:
            process.answer_artifact(message["request_id"], result=result)


def exit_code(jobs: Iterable[LocalJob]) -> int:
    """0 when every job ended `success` or `skipped`, else 1."""
    return 0 if all(job.status in TERMINAL_OK for job in jobs) else 1


def select_jobs(
    workflow: WorkflowEntry, planned: Iterable[PlannedJob], wanted: Iterable[str]
) -> list[LocalJob]:
    """The workflow's planned jobs, narrowed by `--job` to the named jobs and their transitive needs."""
    planned = list(planned)
    names = set(wanted)
    if names:
        closure: set[str] = set()
        todo = [name for name in names if any(p.job == name for p in planned)]
        while todo:
            name = todo.pop()
            if name in closure:
                continue
            closure.add(name)
            for item in planned:
                if item.job == name:
                    todo.extend(upstream for upstream, _ in item.needs)
        planned = [item for item in planned if item.job in closure]
    entries = {entry.name: entry for entry in workflow.jobs}
    return [LocalJob(workflow, item, entries[item.job]) for item in planned]


Printer = Callable[[str], None]
