"""The `ctx` a step, hook or rule receives (docs/design/authoring.md §2.5), implemented inside the step
process.

Anything that must outlive the step (`set_env`, `add_path`, process groups, events, the result) goes to the
runner over the control channel; secrets arrive the same way and stay in memory.
"""

from __future__ import annotations

import json
import os
import re
import select
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from conveyor.agent.artifact_files import ArtifactPathError, Selection, select_files
from conveyor.agent.caches import CachePathError, Roots, cache_paths, restore_timing_text
from conveyor.agent.caches import hash_files as hash_workspace_files
from conveyor.agent.junit import ReportUnreadable, Summary, summarise
from conveyor.agent.shell import describe, run_command
from conveyor.model.artifact_names import cell_name, name_problem
from conveyor.model.caches import key_problem
from conveyor.model.masking import MIN_SECRET_LENGTH
from conveyor.sdk.context import (
    Artifact,
    CacheHit,
    EventEmitError,
    NeedResult,
    Outcome,
    SecretNotFound,
    ShResult,
    StepFailed,
    SummonedRun,
    SummonError,
    TestSummary,
)

ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
EVENT_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,127}$")
MAX_EVENT_PAYLOAD_BYTES = 64 * 1024
# docs/design/events.md §1: `ctx.emit` gives up after 30 s without an answer (the agent's outbox still
# delivers it, under the same dedup key, once the orchestrator is back).
DEFAULT_EMIT_TIMEOUT_S = 30.0
# An artifact transfer is bounded by the step's own timeout, not by this (a day).
ARTIFACT_TIMEOUT_S = 86_400.0
# `ctx.summon` waits for the agent's answer this much past the summon's own timeout (the agent enforces that).
SUMMON_ANSWER_GRACE_S = 60.0


class ControlChannel:
    """JSON lines to and from the runner over the step's control socket (fd 3 by default)."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._writer = sock.makefile("w", encoding="utf-8", newline="\n")
        self._buffer = b""
        self._send_lock = threading.Lock()
        self._receive_lock = threading.Lock()
        # Answers read by one thread for another thread's request (several threads may emit at once).
        self._answers: dict[str, dict[str, Any]] = {}

    def send(self, message: Mapping[str, Any]) -> None:
        """Write one message; safe from several threads."""
        line = json.dumps(message, default=str) + "\n"
        with self._send_lock:
            self._writer.write(line)
            self._writer.flush()

    def receive(self, timeout: float | None = None) -> dict[str, Any]:
        """Read the next message from the runner; TimeoutError after `timeout` seconds without one."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buffer:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self._sock], [], [], remaining)
            if not ready:
                raise TimeoutError("no message from the runner in time")
            chunk = self._sock.recv(65536)
            if not chunk:
                raise EOFError("the runner closed the control channel")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        message: dict[str, Any] = json.loads(line)
        return message

    def answer(self, request_id: str, timeout: float) -> dict[str, Any]:
        """The runner's answer to request `request_id`; TimeoutError after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        if not self._receive_lock.acquire(timeout=timeout):
            raise TimeoutError("no answer from the runner in time")
        try:
            while request_id not in self._answers:
                message = self.receive(max(0.0, deadline - time.monotonic()))
                self._answers[str(message.get("request_id"))] = message
            return self._answers.pop(request_id)
        finally:
            self._receive_lock.release()


@dataclass(frozen=True, slots=True)
class NamedThing:
    """`ctx.workflow`, `ctx.job`, `ctx.step`."""

    name: str


class StepSecrets:
    """`ctx.secrets`: read from memory; `expose` is the only way into the environment."""

    def __init__(self, values: Mapping[str, str], context: StepContextImpl) -> None:
        self._values = dict(values)
        self._context = context

    def get(self, name: str) -> str:
        """The value; raises `SecretNotFound` naming the available names."""
        if name not in self._values:
            raise SecretNotFound(name, list(self._values))
        value = self._values[name]
        if 0 < len(value) < MIN_SECRET_LENGTH:
            self._context.log.warn(
                f"secret {name!r} is shorter than {MIN_SECRET_LENGTH} characters and is not masked in logs"
            )
        return value

    def has(self, name: str) -> bool:
        """Whether the job can see the secret."""
        return name in self._values

    def names(self) -> list[str]:
        """The names visible to this job."""
        return sorted(self._values)

    def expose(self, name: str, as_env: str | None = None, *, as_: str | None = None) -> None:
        """Set env var `as_` (default: the same name) to the secret for the rest of this step only."""
        target = as_ or as_env or name
        if not ENV_NAME_RE.match(target):
            raise ValueError(f"invalid environment variable name {target!r}")
        self._context._step_env[target] = self.get(name)
        self._context.apply_environment()


class StepLogger:
    """`ctx.log.debug/info/warn/error(msg, **fields)`: structured lines in the step log."""

    def __init__(self, write: Callable[[str], None]) -> None:
        self._write = write

    def _line(self, level: str, msg: str, fields: Mapping[str, Any]) -> None:
        extra = "".join(f" {key}={json.dumps(value, default=str)}" for key, value in fields.items())
        self._write(f"{level.upper()}: {msg}{extra}")

    def debug(self, msg: str, **fields: Any) -> None:
        """A debug line."""
        self._line("debug", msg, fields)

    def info(self, msg: str, **fields: Any) -> None:
        """An info line."""
        self._line("info", msg, fields)

    def warn(self, msg: str, **fields: Any) -> None:
        """A warning line."""
        self._line("warning", msg, fields)

    def error(self, msg: str, **fields: Any) -> None:
        """An error line."""
        self._line("error", msg, fields)


class _AttributeMapping(Mapping[str, Any]):
    """A read-only mapping whose keys are also attributes (`ctx.matrix.py`)."""

    def __init__(self, values: Mapping[str, Any]) -> None:
        self._values = dict(values)

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self) -> Any:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __getattr__(self, name: str) -> Any:
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(name) from None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._values!r})"


class EventView(_AttributeMapping):
    """`ctx.event`: the normalised event, readable as `ctx.event.branch` or `ctx.event["branch"]`."""


def _need_result(document: Mapping[str, Any]) -> NeedResult:
    return NeedResult(
        status=document.get("status", "skipped"),
        outputs=MappingProxyType(dict(document.get("outputs") or {})),
        by_matrix=MappingProxyType(
            {key: _need_result(value) for key, value in (document.get("by_matrix") or {}).items()}
        ),
    )


class _Needs(Mapping[str, NeedResult]):
    def __init__(self, upstream: Mapping[str, Any]) -> None:
        self._results = {name: _need_result(value) for name, value in upstream.items()}

    def __getitem__(self, key: Any) -> NeedResult:
        name = key if isinstance(key, str) else getattr(key, "name", key)
        if name not in self._results:
            raise KeyError(f"job {name!r} is not in this job's needs")
        return self._results[name]

    def __iter__(self) -> Any:
        return iter(self._results)

    def __len__(self) -> int:
        return len(self._results)


def unknown_ctx_attribute(name: str, known: list[str]) -> str:
    """The message for `ctx.<name>` when `ctx` has no such attribute, with the closest public names."""
    import difflib

    public = [k for k in known if not k.startswith("_")]
    close = difflib.get_close_matches(name, public, n=3, cutoff=0.6)
    hint = f"; did you mean {' or '.join(f'ctx.{c}' for c in close)}?" if close else ""
    return f"ctx has no attribute {name!r}{hint}"


class StepContextImpl:
    """The `ctx` of a step or hook; rule checks get the same object (they use its `RuleContext` part)."""

    def __init__(self, run: Mapping[str, Any], control: ControlChannel, stdout: Any, stderr: Any) -> None:
        details = run["ctx"]
        self._control = control
        self._stdout, self._stderr = stdout, stderr
        self._write_lock = threading.Lock()
        self._job_env: dict[str, str] = dict(run["env"])
        self._step_env: dict[str, str] = {}
        self._workspace = Path(details["workspace"])
        self._src = Path(run["root"])
        # A container job's commands run in its job container (docs/design/containers.md §3).
        self._container: Mapping[str, Any] | None = run.get("container")
        self.log = StepLogger(self._write_out)
        self.secrets = StepSecrets(run.get("secrets") or {}, self)
        event = details.get("event") or {}
        self.event = EventView(event)
        self.changed_files: list[str] | None = event.get("changed_files")
        self.inputs: Mapping[str, Any] = MappingProxyType(dict(details.get("inputs") or {}))
        matrix = details.get("matrix")
        self.matrix: Mapping[str, Any] | None = None if matrix is None else _AttributeMapping(matrix)
        self.needs: Mapping[str, NeedResult] = _Needs(details.get("needs") or {})
        self.workflow = NamedThing(details["workflow"])
        self.job = NamedThing(details["job"])
        self.step = NamedThing(details.get("step") or "")
        self.run_id: str = details.get("run_id", "")
        self.attempt: int = int(run.get("attempt", 1))
        self.environment: str | None = details.get("environment")
        self.is_local: bool = bool(details.get("is_local"))
        outcome = details.get("outcome")
        self.outcome: Outcome | None = None if outcome is None else Outcome(**outcome)
        self._outputs: dict[str, Mapping[str, Any] | None] = details.get("outputs_of") or {}
        self._emit_timeout_s = float(details.get("emit_timeout_s") or DEFAULT_EMIT_TIMEOUT_S)
        # `ctx.cache` blocks that ended well and were not exact hits: saved when the step succeeds.
        self._pending_caches: list[tuple[str, list[tuple[str, str]]]] = []

    def __getattr__(self, name: str) -> Any:
        # Only for names that do not exist (a typo such as `ctx.shh`): speak of `ctx`, the name the author
        # wrote, never of this implementation class.
        raise AttributeError(unknown_ctx_attribute(name, dir(self)))

    # -- RuleContext -------------------------------------------------------------------------------

    @property
    def env(self) -> Mapping[str, str]:
        """The step's current environment (read-only)."""
        return MappingProxyType({**self._job_env, **self._step_env})

    @property
    def workspace(self) -> Path:
        """The job's checkout (`<workspace>/src`)."""
        return self._src

    def _write_out(self, line: str) -> None:
        with self._write_lock:
            self._stdout.write(line + "\n")
            self._stdout.flush()

    def sh(
        self,
        cmd: str | list[str],
        *,
        check: bool = True,
        env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None,
        timeout: float | None = None,
        input: str | None = None,
        quiet: bool = False,
    ) -> ShResult:
        """Run a command: `str` under `bash -e -o pipefail -c`, `list[str]` as argv with no shell."""
        if not isinstance(cmd, str | list):
            raise TypeError(f"ctx.sh takes a str (shell) or a list[str] (argv), not {type(cmd).__name__}")
        if not quiet:
            self._write_out(f"$ {describe(cmd)}")
        directory = self._src if cwd is None else (self._src / cwd)
        if self._container is not None:
            # Imported here: aiodocker (aiohttp) is a cost a host job's step process need not pay.
            from conveyor.agent.container_exec import run_in_container

            return run_in_container(
                cmd,
                container=self._container,
                env={**self.env, **(env or {})},
                cwd=directory,
                tmp=self._workspace / "tmp",
                check=check,
                timeout=timeout,
                input=input,
                stdout=self._stdout,
                stderr=self._stderr,
                write_lock=self._write_lock,
            )
        return run_command(
            cmd,
            env={**self.env, **(env or {})},
            cwd=directory,
            check=check,
            timeout=timeout,
            input=input,
            stdout=self._stdout,
            stderr=self._stderr,
            report_group=lambda pgid: self._control.send({"type": "proc", "pgid": pgid}),
            write_lock=self._write_lock,
        )

    # -- StepContext -------------------------------------------------------------------------------

    def set_env(self, name: str, value: str) -> None:
        """Set a variable for later `sh` calls, steps and hooks of this job (not `PATH`/`CONVEYOR_*`)."""
        if not isinstance(name, str) or not ENV_NAME_RE.match(name):
            raise ValueError(f"invalid environment variable name {name!r}")
        if name == "PATH" or name.startswith("CONVEYOR_"):
            raise ValueError(f"{name!r} is reserved (use ctx.add_path for PATH)")
        if not isinstance(value, str):
            raise TypeError(f"value of {name!r} must be a str")
        self._job_env[name] = value
        self._step_env.pop(name, None)
        self._control.send({"type": "set_env", "name": name, "value": value})

    def add_path(self, directory: str | Path) -> None:
        """Prepend a directory to PATH for later `sh` calls, steps and hooks of this job."""
        text = str(directory)
        current = self._job_env.get("PATH", "")
        self._job_env["PATH"] = text + (os.pathsep + current if current else "")
        self._control.send({"type": "add_path", "dir": text})

    def emit(
        self,
        name: str,
        payload: Mapping[str, Any] | None = None,
        *,
        target_repos: Sequence[str] | None = None,
    ) -> str:
        """Emit a custom event; returns its id once the orchestrator committed it."""
        if not isinstance(name, str) or not EVENT_NAME_RE.match(name):
            raise ValueError(f"invalid event name {name!r} (lowercase letters, digits, '.', '_', '-')")
        if name.startswith("__") or name.startswith("conveyor."):
            raise ValueError(f"event names starting with '__' or 'conveyor.' are reserved: {name!r}")
        body = dict(payload or {})
        if len(json.dumps(body).encode("utf-8")) > MAX_EVENT_PAYLOAD_BYTES:
            raise ValueError("event payload is over 64 KiB")
        request_id = str(uuid.uuid4())
        self._control.send(
            {
                "type": "emit",
                "request_id": request_id,
                "name": name,
                "payload": body,
                "target_repos": None if target_repos is None else list(target_repos),
            }
        )
        try:
            answer = self._control.answer(request_id, self._emit_timeout_s)
        except TimeoutError:
            detail = f"no answer from the orchestrator within {self._emit_timeout_s:g} s"
            raise EventEmitError(name, "timeout", detail) from None
        error = answer.get("error")
        if error:
            raise EventEmitError(
                name, str(error.get("code")), str(error.get("detail") or ""), error.get("retry_after_ms")
            )
        return str(answer.get("event_id"))

    # -- summoned runs (docs/design/execution.md §8.6) ------------------------------------------------

    def summon(
        self,
        workflow: str,
        inputs: Mapping[str, Any] | None = None,
        *,
        repo: str | None = None,
        wait: bool = True,
        timeout: float = 3600,
    ) -> SummonedRun:
        """Start a run of `workflow`'s `dispatch` trigger through the agent (which holds the job's credential);
        with `wait`, return once it ended, with its outputs."""
        if not isinstance(workflow, str) or not workflow:
            raise ValueError("summon: name a workflow")
        if timeout <= 0:
            raise ValueError("summon: timeout must be positive")
        request_id = str(uuid.uuid4())
        self._control.send(
            {
                "type": "summon",
                "request_id": request_id,
                "workflow": workflow,
                "inputs": dict(inputs or {}),
                "repo": repo,
                "wait": bool(wait),
                "timeout_s": float(timeout),
            }
        )
        try:
            # The agent gives up at `timeout`; this bound only covers an agent that never answers.
            answer = self._control.answer(request_id, float(timeout) + SUMMON_ANSWER_GRACE_S)
        except TimeoutError:
            raise SummonError(workflow, "timeout", "no answer from the agent") from None
        error = answer.get("error")
        if error:
            raise SummonError(
                workflow, str(error.get("code")), str(error.get("detail") or ""), error.get("run_id")
            )
        return summoned_run(answer.get("result") or {})

    # -- artifacts (docs/design/artifacts.md §5) ------------------------------------------------------

    def _artifact_request(self, op: str, **fields: Any) -> Any:
        """Ask the agent (through the runner) to move artifact bytes; StepFailed with its reason."""
        request_id = str(uuid.uuid4())
        self._control.send({"type": "artifact", "request_id": request_id, "op": op, **fields})
        try:
            answer = self._control.answer(request_id, ARTIFACT_TIMEOUT_S)
        except TimeoutError:
            raise StepFailed(f"artifact {op}: no answer from the agent") from None
        if answer.get("error"):
            raise StepFailed(str(answer["error"]))
        return answer.get("result")

    def upload_artifact(
        self, name: str, paths: str | Path | Sequence[str | Path], retention_days: int | None = None
    ) -> Artifact:
        """Upload files, directories or globs (relative to the workspace) as this run's artifact `name`
        (a matrix cell's is `name-<values>`); returns what was stored."""
        stored = self._stored_name(name)
        try:
            selection = select_files(self._src, paths)
        except ArtifactPathError as error:
            raise StepFailed(f"artifact {stored}: {error}") from None
        return self._upload_selection(stored, selection, retention_days)

    def _stored_name(self, name: str) -> str:
        """The name a step's artifact is stored under (a matrix cell's is `name-<values>`)."""
        problem = name_problem(name)
        if problem is not None:
            raise StepFailed(problem)
        return cell_name(name, self.matrix)

    def _upload_selection(self, stored: str, selection: Selection, retention_days: int | None) -> Artifact:
        result = self._artifact_request(
            "upload",
            name=stored,
            root=str(self._src),
            files=list(selection.files),
            format=selection.format,
            filename=selection.filename,
            retention_days=retention_days,
        )
        return _artifact(result)

    def download_artifact(self, name: str, dest: str | Path = ".") -> Path:
        """Write an artifact of this run into `dest` (a directory under the workspace): a file artifact as
        `dest/<filename>`, a tar one extracted; returns the file or directory written."""
        target = (self._src / dest).resolve()
        root = self._src.resolve()
        if target != root and root not in target.parents:
            raise StepFailed(f"artifact {name}: {dest} is outside the workspace")
        result = self._artifact_request("download", name=name, dest=str(target))
        return Path(str(result["path"]))

    @property
    def artifacts(self) -> list[Artifact]:
        """This run's artifacts, as they are now."""
        return [_artifact(item) for item in self._artifact_request("list")]

    def upload_test_report(self, path: str | Path, name: str | None = None) -> TestSummary:
        """Upload JUnit XML (a file or a glob) as an artifact and record its summary with the run."""
        try:
            selection = select_files(self._src, path)
        except ArtifactPathError as error:
            raise StepFailed(f"test report: {error}") from None
        summary = Summary()
        try:
            for file in selection.files:
                summary.add(summarise(self._src / file))
        except ReportUnreadable as error:
            raise StepFailed(f"test report: {error}") from None
        # The files just summarised are the ones uploaded: not selected again (a second walk of the
        # workspace, which could find a report written since).
        artifact = self._upload_selection(self._stored_name(name or "test-report"), selection, None)
        self._artifact_request(
            "report",
            artifact=artifact.name,
            passed=summary.passed,
            failed=summary.failed,
            skipped=summary.skipped,
            errors=summary.errors,
            failures=summary.failures,
        )
        self.log.info(
            f"test report {artifact.name}: {summary.passed} passed, {summary.failed} failed, "
            f"{summary.errors} errors, {summary.skipped} skipped"
        )
        return TestSummary(
            artifact.name,
            summary.passed,
            summary.failed,
            summary.skipped,
            summary.errors,
            tuple(summary.failures),
        )

    # -- caches (docs/design/caches.md §5) -----------------------------------------------------------

    def _cache_roots(self) -> Roots:
        return Roots(self._src, Path.home())

    @contextmanager
    def cache(
        self, key: str, paths: str | Path | Sequence[str | Path], restore_keys: Sequence[str] = ()
    ) -> Iterator[CacheHit]:
        """Restore the newest readable entry for `key` (else by `restore_keys` prefixes, in order) into
        `paths`; when the step succeeds and `key` was not hit exactly, save `paths` under `key`."""
        if isinstance(restore_keys, str):
            restore_keys = (restore_keys,)
        for value, what in [(key, "cache key"), *((prefix, "restore key") for prefix in restore_keys)]:
            problem = key_problem(value, what)
            if problem is not None:
                raise StepFailed(problem)
        roots = self._cache_roots()
        try:
            pairs = cache_paths(roots, paths)
        except CachePathError as error:
            raise StepFailed(f"cache {key}: {error}") from None
        hit, timing = CacheHit("miss"), None
        try:
            result = self._artifact_request(
                "cache.restore",
                key=key,
                restore_keys=list(restore_keys),
                workspace=str(roots.workspace),
                home=str(roots.home),
            )
            hit = CacheHit(str(result["kind"]), result.get("key"))
            timing = restore_timing_text(result)
        except StepFailed as error:
            # A cache only makes a step faster: a failed restore is a miss, said in the log.
            self.log.warn(f"cache {key}: not restored: {error}")
        self.log.info(f"cache {key}: {hit.kind} hit ({hit.key})" if hit.key else f"cache {key}: miss")
        if timing:
            self.log.info(f"cache {key}: {timing}")
        yield hit
        if hit.kind != "exact":
            self._pending_caches.append((key, pairs))

    def save_caches(self) -> None:
        """Save the step's pending cache entries; called once the step's function returned well."""
        roots = self._cache_roots()
        for key, pairs in self._pending_caches:
            try:
                result = self._artifact_request(
                    "cache.save",
                    key=key,
                    paths=[list(pair) for pair in pairs],
                    workspace=str(roots.workspace),
                    home=str(roots.home),
                )
            except StepFailed as error:
                self.log.warn(f"cache {key}: not saved: {error}")
                continue
            if result.get("saved"):
                self.log.info(f"cache {key}: saved ({int(result.get('size') or 0)} bytes)")
            else:
                self.log.info(f"cache {key}: not saved ({result.get('reason') or 'the key exists'})")
        self._pending_caches.clear()

    def hash_files(self, *globs: str) -> str:
        """A stable SHA-256 of the files the globs match in the workspace, for building cache keys."""
        return hash_workspace_files(self._src, globs)

    def outputs_of(self, step: Any) -> Mapping[str, Any]:
        """The outputs an earlier step of this job returned (`{}` when it was skipped or failed)."""
        name = step if isinstance(step, str) else getattr(step, "name", None)
        if name not in self._outputs:
            raise KeyError(f"step {name!r} is unknown or has not run yet")
        return MappingProxyType(dict(self._outputs[name] or {}))

    def apply_environment(self) -> None:
        """Make `os.environ` the step environment, so user code that spawns processes itself sees it."""
        os.environ.clear()
        os.environ.update(self.env)


def summoned_run(item: Mapping[str, Any]) -> SummonedRun:
    """The step's view of the agent's answer to a summon."""
    return SummonedRun(
        id=str(item["run_id"]),
        number=int(item["number"]),
        workflow=str(item["workflow"]),
        repo=str(item.get("repo") or ""),
        routing_key=str(item.get("routing_key") or ""),
        status=str(item["status"]),
        reason=item.get("reason"),
        outputs=dict(item.get("outputs") or {}),
    )


def _artifact(item: Mapping[str, Any]) -> Artifact:
    return Artifact(
        name=str(item["name"]),
        size=int(item["size"]),
        sha256=str(item["sha256"]),
        job=item.get("job"),
        format=str(item.get("format", "file")),
        filename=item.get("filename"),
        created_at=str(item.get("created_at", "")),
    )


def stream_writers() -> tuple[Any, Any]:
    """Line-buffered stdout/stderr, so a crash loses nothing already printed."""
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    sys.stderr.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    return sys.stdout, sys.stderr
