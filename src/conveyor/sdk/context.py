"""The step context `ctx` as an interface (docs/design/authoring.md §2.5); the agent's runner implements
it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from conveyor.errors import ConveyorError


@dataclass(frozen=True, slots=True)
class ShResult:
    """The outcome of `ctx.sh`: captured text is UTF-8 (errors replaced), capped at 16 MiB per stream."""

    args: str | list[str]
    returncode: int
    stdout: str
    stderr: str
    duration_s: float
    truncated: bool = False


class EventEmitError(ConveyorError, RuntimeError):
    """`ctx.emit` was refused (`code`: the API error code, e.g. `rate_limited`, `chain_depth_exceeded`,
    `not_job_owner`) or got no answer in time (`timeout`); `retry_after_ms` hints when to try again."""

    def __init__(self, name: str, code: str, detail: str = "", retry_after_ms: int | None = None) -> None:
        super().__init__(f"event {name!r} was not emitted: {code}" + (f": {detail}" if detail else ""))
        self.name = name
        self.code = code
        self.detail = detail
        self.retry_after_ms = retry_after_ms


class StepFailed(ConveyorError):
    """Raise to fail the current step with only this message (no traceback)."""


class SummonError(ConveyorError, RuntimeError):
    """`ctx.summon` was refused (`code`: the API error code, e.g. `untrusted`, `chain_depth_exceeded`,
    `invalid_inputs`) or the summoned run did not end within the timeout (`timeout`; the run goes on)."""

    def __init__(self, workflow: str, code: str, detail: str = "", run_id: str | None = None) -> None:
        super().__init__(f"summon of {workflow!r} failed: {code}" + (f": {detail}" if detail else ""))
        self.workflow = workflow
        self.code = code
        self.detail = detail
        self.run_id = run_id


@dataclass(frozen=True, slots=True)
class SummonedRun:
    """A run `ctx.summon` started (docs/design/execution.md §8.6): its status when the call returned, and with
    `wait` its end and outputs (`{job display name: {step: {key: value}}}`)."""

    id: str
    number: int
    workflow: str
    repo: str
    routing_key: str
    status: str
    reason: str | None = None
    outputs: Mapping[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """The run ended `success`."""
        return self.status == "success"


class ShError(ConveyorError):
    """`ctx.sh` exited non-zero with `check=True`; `.result` holds the `ShResult`."""

    def __init__(self, result: ShResult) -> None:
        tail = "\n".join(result.stderr.splitlines()[-20:])
        super().__init__(f"command exited with code {result.returncode}" + (f":\n{tail}" if tail else ""))
        self.result = result


class ShTimeout(ConveyorError):
    """`ctx.sh` exceeded its `timeout` and was terminated."""

    def __init__(self, args: str | list[str], timeout_s: float) -> None:
        super().__init__(f"command timed out after {timeout_s:g}s")
        self.args_ = args
        self.timeout_s = timeout_s


class SecretNotFound(ConveyorError, KeyError):
    """`ctx.secrets.get` of a name the job cannot see; lists the names it can."""

    def __init__(self, name: str, available: Sequence[str]) -> None:
        super().__init__(f"secret {name!r} not found; available: {', '.join(sorted(available)) or '(none)'}")
        self.name = name
        self.available = tuple(available)


@dataclass(frozen=True, slots=True)
class NeedResult:
    """An upstream job's aggregate status and outputs (`{step: {key: value}}`); matrix upstreams add `by_matrix`."""

    status: str
    outputs: Mapping[str, Mapping[str, Any]]
    by_matrix: Mapping[str, NeedResult] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Artifact:
    """An artifact of this run (docs/design/artifacts.md §5)."""

    name: str
    size: int
    sha256: str
    job: str | None
    format: str
    filename: str | None
    created_at: str


@dataclass(frozen=True, slots=True)
class TestSummary:
    """What `ctx.upload_test_report` recorded: counts and the failing tests (`{name, message}`)."""

    artifact: str
    passed: int
    failed: int
    skipped: int
    errors: int
    failures: tuple[dict[str, str], ...]


@dataclass(frozen=True, slots=True)
class CacheHit:
    """What `ctx.cache` restored (docs/design/caches.md §1): `kind` is `exact`, `partial` or `miss`; `key`
    the restored entry's key. True for an exact hit only, so `if not hit:` means "fill it"."""

    kind: str
    key: str | None = None

    def __bool__(self) -> bool:
        return self.kind == "exact"


@dataclass(frozen=True, slots=True)
class Outcome:
    """What hooks see about the owner they follow."""

    status: str
    reason: str | None
    failed_step: str | None
    duration_s: float


class Secrets(Protocol):
    """Org secrets ∪ the job environment's secrets (the environment wins)."""

    def get(self, name: str) -> str:
        """The value; raises `SecretNotFound` naming the available names."""
        ...

    def has(self, name: str) -> bool:
        """Whether the secret exists."""
        ...

    def names(self) -> list[str]:
        """The names visible to this job."""
        ...

    def expose(self, name: str, as_env: str | None = None) -> None:
        """Put the secret in the environment of later `sh` calls (still masked in logs)."""
        ...


class StepLog(Protocol):
    """Structured lines in the step log."""

    def debug(self, msg: str, **fields: Any) -> None: ...
    def info(self, msg: str, **fields: Any) -> None: ...
    def warn(self, msg: str, **fields: Any) -> None: ...
    def error(self, msg: str, **fields: Any) -> None: ...


class Named(Protocol):
    """Something with a name (`ctx.workflow`, `ctx.job`, `ctx.step`)."""

    @property
    def name(self) -> str: ...


@runtime_checkable
class RuleContext(Protocol):
    """What a rule check receives: the event, changed files, env, inputs, matrix and `sh`."""

    @property
    def event(self) -> Any: ...
    @property
    def changed_files(self) -> list[str] | None: ...
    @property
    def env(self) -> Mapping[str, str]: ...
    @property
    def inputs(self) -> Mapping[str, Any]: ...
    @property
    def matrix(self) -> Mapping[str, Any] | None: ...

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
        ...


@runtime_checkable
class StepContext(RuleContext, Protocol):
    """The `ctx` a step or hook function receives."""

    @property
    def secrets(self) -> Secrets: ...
    @property
    def needs(self) -> Mapping[str, NeedResult]: ...
    @property
    def log(self) -> StepLog: ...
    @property
    def workflow(self) -> Named: ...
    @property
    def job(self) -> Named: ...
    @property
    def step(self) -> Named: ...
    @property
    def run_id(self) -> str: ...
    @property
    def attempt(self) -> int: ...
    @property
    def workspace(self) -> Path: ...
    @property
    def environment(self) -> str | None: ...
    @property
    def is_local(self) -> bool: ...
    @property
    def outcome(self) -> Outcome | None: ...

    def set_env(self, name: str, value: str) -> None:
        """Set a variable for later `sh` calls, steps and hooks of this job (not `PATH`/`CONVEYOR_*`)."""
        ...

    def add_path(self, directory: str | Path) -> None:
        """Prepend a directory to PATH for later `sh` calls, steps and hooks of this job."""
        ...

    def emit(
        self,
        name: str,
        payload: Mapping[str, Any] | None = None,
        *,
        target_repos: Sequence[str] | None = None,
    ) -> str:
        """Emit a custom event; returns its id once the orchestrator committed it."""
        ...

    def summon(
        self,
        workflow: str,
        inputs: Mapping[str, Any] | None = None,
        *,
        repo: str | None = None,
        wait: bool = True,
        timeout: float = 3600,
    ) -> SummonedRun:
        """Start a run of `workflow`'s `dispatch` trigger (this repository, or the org's source `repo` where
        trust allows); with `wait`, return once it ended, with its outputs. `SummonError` when refused."""
        ...

    def outputs_of(self, step: Any) -> Mapping[str, Any]:
        """The outputs an earlier step of this job returned."""
        ...

    def upload_artifact(
        self, name: str, paths: str | Path | Sequence[str | Path], retention_days: int | None = None
    ) -> Artifact:
        """Upload files, directories or globs (relative to the workspace) as this run's artifact `name`."""
        ...

    def download_artifact(self, name: str, dest: str | Path = ".") -> Path:
        """Write an artifact of this run into `dest` (under the workspace); the path written."""
        ...

    @property
    def artifacts(self) -> list[Artifact]: ...

    def upload_test_report(self, path: str | Path, name: str | None = None) -> TestSummary:
        """Upload JUnit XML as an artifact and record its pass/fail summary with the run."""
        ...

    def cache(
        self, key: str, paths: str | Path | Sequence[str | Path], restore_keys: Sequence[str] = ()
    ) -> AbstractContextManager[CacheHit]:
        """Restore the newest readable entry for `key` (else by `restore_keys` prefixes, in order) into
        `paths`; when the step succeeds and `key` was not hit exactly, save `paths` under `key`."""
        ...

    def hash_files(self, *globs: str) -> str:
        """A stable SHA-256 of the files the globs match in the workspace, for building cache keys."""
        ...
