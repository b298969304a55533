"""Workflows, jobs, steps, needs, matrices, retries, hooks: the objects workflow files build
(docs/design/authoring.md §2.1)."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, overload

from conveyor.sdk.containers import Container, Service, as_container, as_services
from conveyor.sdk.durations import DurationLike, duration_ms, optional_duration_ms
from conveyor.sdk.errors import authoring_error, caller_location, did_you_mean
from conveyor.sdk.matrix import (
    MatrixLike,
    MatrixValue,
    expand_matrix,
)
from conveyor.sdk.patterns import LabelSpec, PatternLike, label_specs
from conveyor.sdk.rules import Rule, RuleDecorators, as_rules
from conveyor.sdk.templates import TemplateSyntaxError, check_template
from conveyor.sdk.triggers import JOB_TERMINAL_STATUSES, Trigger, as_triggers

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
HOOK_KINDS = ("on_success", "on_failure", "on_cancel", "cleanup")
HookKind = Literal["on_success", "on_failure", "on_cancel", "cleanup"]
StepFunction = Callable[..., Any]

WHEN_STATUSES: dict[str, tuple[str, ...]] = {
    "on-success": ("success",),
    "on-skip": ("success", "skipped"),
    "on-failure": ("failed", "timed_out"),
    "always": ("success", "failed", "cancelled", "skipped", "timed_out"),
}

# Options some CI systems have that this version deliberately refuses (E120) rather than silently ignoring.
UNSUPPORTED_OPTIONS = frozenset({"approval", "approvals", "resources", "dynamic", "image"})


def check_name(name: object, what: str, location: tuple[str, int] | None = None) -> str:
    """Names of workflows, jobs and steps match `^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$` (E105)."""
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise authoring_error(
            "E105", f"invalid {what} name {name!r} (letters, digits, '_', '.', '-'; at most 64)", location
        )
    return name


def _refuse_unsupported(options: Mapping[str, object], what: str, known: Callable[..., Any]) -> None:
    """E120 for the first option `known` (the declaring function) does not take, naming the nearest one."""
    for option in options:
        if option in UNSUPPORTED_OPTIONS:
            raise authoring_error("E120", f"{what}: {option!r} is not supported in this version")
        names = [name for name in inspect.signature(known).parameters if not name.startswith("_")]
        raise authoring_error(
            "E120", f"{what}: {option!r} is not a known option{did_you_mean(option, names)}"
        )


def function_location(fn: Callable[..., Any]) -> tuple[str, int]:
    """Where a function is defined: its file and first line (the first decorator line)."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return caller_location()
    return code.co_filename, code.co_firstlineno


@dataclass(frozen=True, slots=True)
class Retry:
    """Retry policy of a step: wait `min(delay·2^(n-1), max_delay)` (exponential) or `delay` (fixed)."""

    max_attempts: int
    delay_ms: int
    backoff: Literal["exponential", "fixed"]
    max_delay_ms: int
    retry_on: Callable[[BaseException], bool] | None

    def __init__(
        self,
        max_attempts: int,
        delay: DurationLike = "1s",
        backoff: Literal["exponential", "fixed"] = "exponential",
        max_delay: DurationLike = "30s",
        retry_on: Callable[[BaseException], bool] | None = None,
    ) -> None:
        if (
            isinstance(max_attempts, bool)
            or not isinstance(max_attempts, int)
            or not 1 <= max_attempts <= 100
        ):
            raise authoring_error(
                "E114", f"Retry(max_attempts=) must be an int from 1 to 100, not {max_attempts!r}"
            )
        if backoff not in ("exponential", "fixed"):
            raise authoring_error(
                "E114", f"Retry(backoff=) must be 'exponential' or 'fixed', not {backoff!r}"
            )
        if retry_on is not None and not callable(retry_on):
            raise authoring_error("E114", "Retry(retry_on=) must be callable")
        object.__setattr__(self, "max_attempts", max_attempts)
        object.__setattr__(self, "delay_ms", duration_ms(delay, what="Retry(delay=)"))
        object.__setattr__(self, "backoff", backoff)
        object.__setattr__(self, "max_delay_ms", duration_ms(max_delay, what="Retry(max_delay=)"))
        object.__setattr__(self, "retry_on", retry_on)


def as_retry(value: Retry | int | None) -> Retry | None:
    """`retry=N` means N retries (`max_attempts=N+1`); a `Retry` is taken as is."""
    if value is None or isinstance(value, Retry):
        return value
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise authoring_error("E114", f"retry= must be a non-negative int or Retry(...), not {value!r}")
    return None if value == 0 else Retry(max_attempts=value + 1)


@dataclass(frozen=True, slots=True)
class RunsOn:
    """Agent label requirements: every matcher in `labels` must match a label; no label may match `exclude`."""

    labels: tuple[LabelSpec, ...]
    exclude: tuple[LabelSpec, ...]

    def __init__(
        self, labels: PatternLike | Iterable[PatternLike], exclude: PatternLike | Iterable[PatternLike] = ()
    ) -> None:
        object.__setattr__(self, "labels", label_specs(labels, what="runs_on"))
        object.__setattr__(self, "exclude", label_specs(exclude, what="runs_on exclude"))
        if not self.labels:
            raise authoring_error("E108", "runs_on needs at least one label")


RunsOnLike = RunsOn | PatternLike | Iterable[PatternLike]


def as_runs_on(value: RunsOnLike | None, what: str) -> RunsOn:
    """Normalise a `runs_on` option: one matcher, a list (AND), or `RunsOn(...)`; missing or empty is E108."""
    if value is None:
        raise authoring_error(
            "E108", f"{what}: runs_on is required (for example runs_on='conveyor:os:linux')"
        )
    if isinstance(value, RunsOn):
        return value
    return RunsOn(value)


@dataclass(frozen=True, slots=True)
class Concurrency:
    """Workflow concurrency: runs sharing the rendered `group` wait (FIFO, `max` active) or supersede."""

    group: str
    cancel_in_progress: bool = False
    max: int = 1


@dataclass(slots=True)
class Hook:
    """A lifecycle hook function of a job or workflow."""

    kind: HookKind
    fn: StepFunction
    timeout_ms: int


class HookDecorators:
    """`@owner.on_success`, `.on_failure`, `.on_cancel`, `.cleanup`, bare or with `(timeout=...)`."""

    hooks: dict[str, Hook]
    _owner_description: str

    def _add_hook(self, kind: HookKind, fn: StepFunction | None, timeout: DurationLike) -> Any:
        timeout_ms = duration_ms(timeout, what=f"{kind}(timeout=)")

        def add(function: StepFunction) -> StepFunction:
            if not callable(function):
                raise authoring_error("E114", f"{kind} must decorate a function")
            if kind in self.hooks:
                raise authoring_error(
                    "E119",
                    f"{self._owner_description} already has an {kind} hook",
                    function_location(function),
                )
            self.hooks[kind] = Hook(kind, function, timeout_ms)
            return function

        return add if fn is None else add(fn)

    def on_success(self, fn: StepFunction | None = None, *, timeout: DurationLike = "5m") -> Any:
        """Run after the steps when everything succeeded; its failure fails the owner."""
        return self._add_hook("on_success", fn, timeout)

    def on_failure(self, fn: StepFunction | None = None, *, timeout: DurationLike = "5m") -> Any:
        """Run after a failure (timeouts included)."""
        return self._add_hook("on_failure", fn, timeout)

    def on_cancel(self, fn: StepFunction | None = None, *, timeout: DurationLike = "5m") -> Any:
        """Run after a graceful cancel."""
        return self._add_hook("on_cancel", fn, timeout)

    def cleanup(self, fn: StepFunction | None = None, *, timeout: DurationLike = "5m") -> Any:
        """Run last, whatever happened."""
        return self._add_hook("cleanup", fn, timeout)


OutputsSpec = Mapping[str, type] | type | None
_OUTPUT_TYPES = (str, int, float, bool, list, dict)


def _check_outputs(outputs: object, location: tuple[str, int]) -> None:
    if outputs is None:
        return
    if isinstance(outputs, Mapping):
        for key, kind in outputs.items():
            if not isinstance(key, str) or kind not in _OUTPUT_TYPES:
                raise authoring_error(
                    "E120", f"outputs: {key!r} must map to one of str, int, float, bool, list, dict", location
                )
        return
    if isinstance(outputs, type) and hasattr(outputs, "model_json_schema"):
        return
    raise authoring_error("E120", "outputs= must be a mapping of name to type, or a pydantic model", location)


class Step(RuleDecorators):
    """One step: a Python function receiving `ctx`, with its own timeout, retry, outputs and rules."""

    def __init__(
        self,
        fn: StepFunction,
        *,
        name: str | None = None,
        timeout: DurationLike | None = None,
        retry: Retry | int | None = None,
        continue_on_error: bool = False,
        outputs: OutputsSpec = None,
        rules: Iterable[Rule] = (),
    ) -> None:
        if not callable(fn):
            raise authoring_error("E114", f"a step must be a function, not {fn!r}")
        self.fn = fn
        self.location = function_location(fn)
        self.name = check_name(name if name is not None else fn.__name__, "step", self.location)
        self.timeout_ms = optional_duration_ms(timeout, what=f"step {self.name!r} timeout")
        self.retry = as_retry(retry)
        self.continue_on_error = bool(continue_on_error)
        _check_outputs(outputs, self.location)
        self.outputs = outputs
        self.rules = as_rules(rules)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the underlying function (handy in tests of step code)."""
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"Step({self.name!r})"


@overload
def step(fn: StepFunction, *, name: str | None = None, **options: Any) -> Step: ...
@overload
def step(fn: None = None, *, name: str | None = None, **options: Any) -> Callable[[StepFunction], Step]: ...
def step(fn: StepFunction | None = None, *, name: str | None = None, **options: Any) -> Any:
    """A detached step (`step(fn, ...)` or `@step(...)`), to pass in a job's `steps=[...]`."""
    allowed = {"timeout", "retry", "continue_on_error", "outputs", "rules"}
    _refuse_unsupported({key: value for key, value in options.items() if key not in allowed}, "step()", Step)
    if fn is None:
        return lambda function: Step(function, name=name, **options)
    return Step(fn, name=name, **options)


@dataclass(frozen=True, slots=True)
class Need:
    """A dependency edge: run after `job` when it ended in one of the `when` statuses."""

    job: Job | str
    run_on: tuple[str, ...]

    def __init__(
        self,
        job: Job | str,
        when: Literal["on-success", "on-skip", "on-failure", "always"] | Iterable[str] = "on-success",
    ) -> None:
        if not isinstance(job, Job | str):
            raise authoring_error("E106", f"needs: {job!r} is not a job or a job name")
        if isinstance(when, str):
            if when not in WHEN_STATUSES:
                raise authoring_error(
                    "E114", f"Need(when=): {when!r} is not one of {', '.join(WHEN_STATUSES)}"
                )
            statuses = WHEN_STATUSES[when]
        else:
            statuses = tuple(when)
            unknown = [status for status in statuses if status not in JOB_TERMINAL_STATUSES]
            if unknown or not statuses:
                raise authoring_error(
                    "E114", f"Need(when=): statuses must be among {', '.join(JOB_TERMINAL_STATUSES)}"
                )
        object.__setattr__(self, "job", job)
        object.__setattr__(self, "run_on", statuses)

    @property
    def job_name(self) -> str:
        """The upstream job's name."""
        return self.job if isinstance(self.job, str) else self.job.name


def as_need(value: object) -> Need:
    """Normalise one `needs` entry: a `Job`, a job name or a `Need`."""
    if isinstance(value, Need):
        return value
    if isinstance(value, Job | str):
        return Need(value)
    raise authoring_error("E106", f"needs: {value!r} is not a job, a job name or Need(...)")


def _check_template_option(
    value: str | None,
    what: str,
    *,
    job_level: bool,
    matrix_keys: tuple[str, ...] | None,
    location: tuple[str, int],
) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise authoring_error("E112", f"{what} must be a template string", location)
    try:
        check_template(value, job_level=job_level, matrix_keys=matrix_keys)
    except TemplateSyntaxError as error:
        raise authoring_error("E112", f"{what}: {error}", location) from None
    return value


def _check_env(env: Mapping[str, str], location: tuple[str, int]) -> dict[str, str]:
    result: dict[str, str] = {}
    for name, value in env.items():
        if not isinstance(name, str) or not ENV_NAME_RE.match(name):
            raise authoring_error("E115", f"env: invalid variable name {name!r}", location)
        if name == "PATH" or name.startswith("CONVEYOR_"):
            raise authoring_error("E115", f"env: {name!r} is reserved (use ctx.add_path for PATH)", location)
        if not isinstance(value, str):
            raise authoring_error("E115", f"env: value of {name!r} must be a str", location)
        result[name] = value
    return result


class Job(RuleDecorators, HookDecorators):
    """A unit of work dispatched to one agent: ordered steps, needs, matrix, routing and limits."""

    def __init__(
        self,
        name: str,
        *,
        runs_on: RunsOnLike | None = None,
        steps: Iterable[Step | StepFunction] = (),
        run: StepFunction | None = None,
        needs: Iterable[Job | str | Need] | Job | str | Need = (),
        matrix: MatrixLike | None = None,
        include: Iterable[Mapping[str, MatrixValue]] = (),
        exclude: Iterable[Mapping[str, MatrixValue]] = (),
        max_parallel: int | None = None,
        fail_fast: bool = False,
        timeout: DurationLike | None = None,
        grace_period: DurationLike = "10s",
        env: Mapping[str, str] | None = None,
        environment: str | None = None,
        concurrency_group: str | None = None,
        checkout: bool = True,
        container: Container | str | None = None,
        services: Mapping[str, Service | str] | None = None,
        rules: Iterable[Rule] = (),
        description: str | None = None,
        fanout: bool = False,
        _location: tuple[str, int] | None = None,
        _fn: StepFunction | None = None,
        **unsupported: Any,
    ) -> None:
        self.location = _location or caller_location()
        _refuse_unsupported(unsupported, f"job {name!r}", Job)
        self.name = check_name(name, "job", self.location)
        self._owner_description = f"job {self.name!r}"
        self.fn = _fn
        self.workflow: Workflow | None = None
        self.runs_on = as_runs_on(runs_on, f"job {self.name!r}")
        self.steps: list[Step] = []
        for item in steps:
            self._add_step(item if isinstance(item, Step) else Step(item))
        if run is not None:
            # The single step of a function-as-job (or `run=`) takes the job's name, lambdas included.
            self._add_step(Step(run, name=self.name))
        raw_needs = [needs] if isinstance(needs, Job | str | Need) else list(needs)
        self.needs = [as_need(item) for item in raw_needs]
        expanded = expand_matrix(matrix, include, exclude, location=self.location)
        self.matrix_keys: tuple[str, ...] | None = expanded[0] if expanded else None
        self.matrix: list[dict[str, MatrixValue]] | None = expanded[1] if expanded else None
        if max_parallel is not None and (
            isinstance(max_parallel, bool) or not isinstance(max_parallel, int) or max_parallel < 1
        ):
            raise authoring_error(
                "E109", f"max_parallel must be a positive int, not {max_parallel!r}", self.location
            )
        self.max_parallel = max_parallel
        self.fail_fast = bool(fail_fast)
        self.timeout_ms = optional_duration_ms(timeout, what=f"job {self.name!r} timeout")
        self.grace_period_ms = duration_ms(grace_period, what=f"job {self.name!r} grace_period")
        self.env = _check_env(env or {}, self.location)
        template_options = {"job_level": True, "matrix_keys": self.matrix_keys, "location": self.location}
        self.environment = _check_template_option(environment, "environment", **template_options)  # type: ignore[arg-type]
        self.concurrency_group = _check_template_option(
            concurrency_group,
            "concurrency_group",
            **template_options,  # type: ignore[arg-type]
        )
        self.checkout = bool(checkout)
        self.container = as_container(container, f"job {self.name!r}")
        self.services = as_services(services, f"job {self.name!r}", self.container)
        self.rules = as_rules(rules)
        self.description = description
        # docs/design/execution.md §13: one execution per connected matching agent; a matrix would multiply it.
        self.fanout = bool(fanout)
        if self.fanout and self.matrix is not None:
            raise authoring_error(
                "E122",
                f"job {self.name!r}: fanout=True runs once per agent and takes no matrix",
                self.location,
            )
        self.hooks: dict[str, Hook] = {}

    def _add_step(self, new_step: Step) -> Step:
        if any(existing.name == new_step.name for existing in self.steps):
            raise authoring_error(
                "E104", f"job {self.name!r} already has a step {new_step.name!r}", new_step.location
            )
        self.steps.append(new_step)
        return new_step

    @overload
    def step(self, fn: StepFunction, /) -> Step: ...
    @overload
    def step(self, fn: None = None, /, **options: Any) -> Callable[[StepFunction], Step]: ...
    def step(self, fn: StepFunction | None = None, /, **options: Any) -> Any:
        """Add a step, as `@job.step` or `@job.step(timeout=..., retry=..., ...)`; returns the `Step`."""
        if isinstance(fn, Step):
            return self._add_step(fn)
        built = step(fn, **options) if fn is not None else None
        if built is not None:
            return self._add_step(built)
        maker = step(None, **options)
        return lambda function: self._add_step(maker(function))

    def __repr__(self) -> str:
        return f"Job({self.name!r})"


JOB_OPTIONS_HELP = """Job options (all keyword-only; docs/authoring.md, "Job options"):

    runs_on             labels an agent must have: a label, a list (all of them), or RunsOn(...); required
    steps               the steps, in order: functions or step(...) (or add them with @job.step)
    run                 a single step function (a function-as-job)
    needs               jobs, job names or Need(job, when=...) that must end first
    matrix              {key: [values]} or [values]: one job per combination
    include, exclude    combinations added to / removed from the matrix
    max_parallel        at most this many combinations running at once
    fail_fast           the first failed combination cancels its unfinished siblings
    timeout             the whole job (checkout, rules, steps, hooks); none by default
    grace_period        SIGTERM to SIGKILL of a cancelled step (default "10s")
    env                 static variables {NAME: value} for every step
    environment         a server-side environment (template): its variables, secrets and branch rules
    concurrency_group   one running job per rendered group (template; defaults to the environment)
    checkout            check out the commit before the steps (default True)
    container           an image, or Container(image, env=, options=): ctx.sh runs inside it
    services            {name: Service(image, env=, ports=, command=, health_cmd=)}: started first, by name
    rules               rule(...) / skip(...) checks run before the steps
    description         free text shown by `conveyor preview`
    fanout              run once on every connected agent runs_on matches (up to max_fanout_hosts), one result per host
"""


@overload
def job(name: str, **options: Any) -> Job: ...
@overload
def job(name: StepFunction, **options: Any) -> Job: ...
def job(
    name: str | StepFunction,
    *,
    runs_on: RunsOnLike | None = None,
    steps: Iterable[Step | StepFunction] = (),
    run: StepFunction | None = None,
    needs: Iterable[Job | str | Need] | Job | str | Need = (),
    matrix: MatrixLike | None = None,
    include: Iterable[Mapping[str, MatrixValue]] = (),
    exclude: Iterable[Mapping[str, MatrixValue]] = (),
    max_parallel: int | None = None,
    fail_fast: bool = False,
    timeout: DurationLike | None = None,
    grace_period: DurationLike = "10s",
    env: Mapping[str, str] | None = None,
    environment: str | None = None,
    concurrency_group: str | None = None,
    checkout: bool = True,
    container: Container | str | None = None,
    services: Mapping[str, Service | str] | None = None,
    rules: Iterable[Rule] = (),
    description: str | None = None,
    fanout: bool = False,
    **unsupported: Any,
) -> Job:
    options: dict[str, Any] = {
        "runs_on": runs_on,
        "steps": steps,
        "needs": needs,
        "matrix": matrix,
        "include": include,
        "exclude": exclude,
        "max_parallel": max_parallel,
        "fail_fast": fail_fast,
        "timeout": timeout,
        "grace_period": grace_period,
        "env": env,
        "environment": environment,
        "concurrency_group": concurrency_group,
        "checkout": checkout,
        "container": container,
        "services": services,
        "rules": rules,
        "description": description,
        "fanout": fanout,
        **unsupported,
    }
    if callable(name) and not isinstance(name, str):
        return Job(name.__name__, run=name, _location=function_location(name), _fn=name, **options)
    return Job(name, run=run, _location=caller_location(), **options)


job.__doc__ = (
    "A detached job; add it with `workflow(..., jobs=[...])`. A function makes a function-as-job.\n\n"
    + JOB_OPTIONS_HELP
)


def _global_options(
    name: str, global_repos: Iterable[str] | None, required: object, location: tuple[str, int]
) -> tuple[tuple[str, ...] | None, bool]:
    """`global_repos` (globs on routing keys) and `required` of a global workflow
    (docs/design/global_workflows.md §2); `required` without `global_repos` is an error."""
    if not isinstance(required, bool):
        raise authoring_error("E114", f"workflow {name!r}: required= must be True or False", location)
    if global_repos is None:
        if required:
            raise authoring_error(
                "E114",
                f"workflow {name!r}: required=True applies to a global workflow (give global_repos=)",
                location,
            )
        return None, False
    repos = (global_repos,) if isinstance(global_repos, str) else tuple(global_repos)
    if not repos or not all(isinstance(glob, str) and glob.strip() for glob in repos):
        raise authoring_error(
            "E114",
            f"workflow {name!r}: global_repos= must be a non-empty list of globs on routing keys (e.g. 'local:*')",
            location,
        )
    return repos, required


class Workflow(RuleDecorators, HookDecorators):
    """A named set of jobs started by triggers; the unit the lock file records."""

    def __init__(
        self,
        name: str,
        *,
        on: Trigger | Iterable[Trigger],
        jobs: Iterable[Job] = (),
        rules: Iterable[Rule] = (),
        concurrency: str | Concurrency | None = None,
        timeout: DurationLike | None = None,
        description: str | None = None,
        hash_files: Iterable[str] = (),
        hooks_runs_on: RunsOnLike | None = None,
        global_repos: Iterable[str] | None = None,
        required: bool = False,
        _location: tuple[str, int] | None = None,
        **unsupported: Any,
    ) -> None:
        self.location = _location or caller_location()
        _refuse_unsupported(unsupported, f"workflow {name!r}", Workflow)
        self.name = check_name(name, "workflow", self.location)
        self._owner_description = f"workflow {self.name!r}"
        self.triggers = as_triggers(on)
        self.jobs: dict[str, Job] = {}
        self.rules = as_rules(rules)
        if isinstance(concurrency, str):
            concurrency = Concurrency(concurrency)
        if concurrency is not None:
            if not isinstance(concurrency, Concurrency):
                raise authoring_error(
                    "E112", "concurrency must be a template string or Concurrency(...)", self.location
                )
            _check_template_option(
                concurrency.group, "concurrency", job_level=False, matrix_keys=None, location=self.location
            )
            if (
                isinstance(concurrency.max, bool)
                or not isinstance(concurrency.max, int)
                or concurrency.max < 1
            ):
                raise authoring_error("E114", "Concurrency(max=) must be a positive int", self.location)
        self.concurrency = concurrency
        self.timeout_ms = optional_duration_ms(timeout, what=f"workflow {self.name!r} timeout")
        self.description = description
        self.hash_files = tuple(hash_files) if not isinstance(hash_files, str) else (hash_files,)
        self.hooks_runs_on = None if hooks_runs_on is None else as_runs_on(hooks_runs_on, "hooks_runs_on")
        self.global_repos, self.required = _global_options(self.name, global_repos, required, self.location)
        self.hooks: dict[str, Hook] = {}
        for item in jobs:
            self.add_job(item)

    def add_job(self, new_job: Job) -> Job:
        """Attach a job (E103 on a duplicate name; a job belongs to one workflow)."""
        if not isinstance(new_job, Job):
            raise authoring_error("E114", f"jobs=: {new_job!r} is not a job(...)")
        if new_job.name in self.jobs:
            raise authoring_error(
                "E103", f"workflow {self.name!r} already has a job {new_job.name!r}", new_job.location
            )
        if new_job.workflow is not None and new_job.workflow is not self:
            raise authoring_error(
                "E103",
                f"job {new_job.name!r} already belongs to workflow {new_job.workflow.name!r}",
                new_job.location,
            )
        new_job.workflow = self
        self.jobs[new_job.name] = new_job
        return new_job

    @overload
    def job(self, name: str, /, **options: Any) -> Job: ...
    @overload
    def job(self, name: StepFunction, /) -> Job: ...
    @overload
    def job(self, name: None = None, /, **options: Any) -> Callable[[StepFunction], Job]: ...
    def job(self, name: str | StepFunction | None = None, /, **options: Any) -> Any:
        if isinstance(name, str):
            return self.add_job(Job(name, _location=caller_location(), **options))

        def function_job(fn: StepFunction) -> Job:
            return self.add_job(Job(fn.__name__, run=fn, _location=function_location(fn), _fn=fn, **options))

        if name is None:
            return function_job
        return function_job(name)

    def __repr__(self) -> str:
        return f"Workflow({self.name!r})"


Workflow.job.__doc__ = (
    '`wf.job("name", **options)` → `Job`; `@wf.job(**options)` on a function makes a function-as-job.\n\n'
    + JOB_OPTIONS_HELP
)


def workflow(
    name: str,
    *,
    on: Trigger | Iterable[Trigger],
    jobs: Iterable[Job] = (),
    rules: Iterable[Rule] = (),
    concurrency: str | Concurrency | None = None,
    timeout: DurationLike | None = None,
    description: str | None = None,
    hash_files: Iterable[str] = (),
    hooks_runs_on: RunsOnLike | None = None,
    global_repos: Iterable[str] | None = None,
    required: bool = False,
    **unsupported: Any,
) -> Workflow:
    """Declare a workflow: its name, triggers (`on`), and options; add jobs with `@wf.job` / `wf.job(...)`.

    `global_repos` (globs on routing keys, e.g. `["local:*"]`) makes it a global workflow of a policy source,
    run for the covered repositories' events too; `required` makes its status gate their commits
    (docs/design/global_workflows.md §2)."""
    return Workflow(
        name,
        on=on,
        jobs=jobs,
        rules=rules,
        concurrency=concurrency,
        timeout=timeout,
        description=description,
        hash_files=hash_files,
        hooks_runs_on=hooks_runs_on,
        global_repos=global_repos,
        required=required,
        _location=caller_location(),
        **unsupported,
    )
