"""The compiler: discover `.conveyor/workflows/*.py`, import each in isolation, validate, build the lock.

Steps and rule checks never run here; only module-level code of workflow files (and what they import) does.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conveyor.lockfile.errors import Diagnostic
from conveyor.lockfile.hashing import content_hash
from conveyor.lockfile.loader import (
    FileImportError,
    PathNames,
    import_workflow_file,
    module_workflows,
)
from conveyor.lockfile.models import (
    LOCK_SCHEMA_VERSION,
    ConcurrencyEntry,
    ContainerEntry,
    DispatchTriggerEntry,
    EqualsCondition,
    EventTriggerEntry,
    GenericWebhookTriggerEntry,
    GlobalEntry,
    HookEntry,
    InCondition,
    InputEntry,
    JobCompleteTriggerEntry,
    JobEntry,
    LabelMatcherEntry,
    Lock,
    MatrixEntry,
    NeedEntry,
    PatternEntry,
    PrTriggerEntry,
    PushTriggerEntry,
    RegexCondition,
    RetryEntry,
    RuleEntry,
    RunsOnEntry,
    ScheduleTriggerEntry,
    ServiceEntry,
    SourceRef,
    StepEntry,
    TagTriggerEntry,
    TriggerEntry,
    WorkflowCompleteTriggerEntry,
    WorkflowEntry,
    WorkflowsFailedBatchTriggerEntry,
)
from conveyor.lockfile.reader import MAX_LOCK_BYTES, render_lock
from conveyor.sdk import triggers as sdk_triggers
from conveyor.sdk.declarations import HOOK_KINDS, WHEN_STATUSES, Hook, Job, RunsOn, Step, Workflow
from conveyor.sdk.errors import did_you_mean
from conveyor.sdk.patterns import LabelSpec, PatternSpec
from conveyor.sdk.rules import Rule

HOOKS_JOB_NAME = "__hooks__"


@dataclass(frozen=True, slots=True)
class WorkflowSummary:
    """One line of `conveyor compile` output."""

    name: str
    file: str
    triggers: int
    jobs: int
    content_hash: str


@dataclass
class CompileResult:
    """What compiling a repository produced: the lock (when there are no errors) and diagnostics."""

    lock: Lock | None
    lock_bytes: bytes | None
    errors: list[Diagnostic] = field(default_factory=list)
    warnings: list[Diagnostic] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when the lock was built."""
        return not self.errors and self.lock is not None

    def summaries(self) -> list[WorkflowSummary]:
        """Per-workflow counts for display."""
        if self.lock is None:
            return []
        return [
            WorkflowSummary(
                entry.name, entry.source.file, len(entry.triggers), len(entry.jobs), entry.content_hash
            )
            for entry in self.lock.workflows
        ]


class _PathNames(PathNames):
    """`PathNames` that also names a function's source for the lock."""

    def source(self, filename: str, line: int, qualname: str | None, module: str | None = None) -> SourceRef:
        relative = self.relative(filename)
        if relative is None:
            # Code from an installed package: name it by module so no absolute path leaks into the lock.
            relative = f"python:{module or Path(filename).stem}"
        return SourceRef(file=relative, qualname=qualname, line=line)


def discover_workflow_files(root: Path) -> list[Path]:
    """`.conveyor/workflows/*.py`, not recursive, skipping files starting with `_`, sorted by name."""
    directory = root / ".conveyor" / "workflows"
    if not directory.is_dir():
        return []
    return sorted(
        (path for path in directory.glob("*.py") if not path.name.startswith("_") and path.is_file()),
        key=lambda path: path.name,
    )


def _pattern_entries(specs: Iterable[PatternSpec]) -> list[PatternEntry]:
    return [PatternEntry(kind=s.kind, pattern=s.pattern, flags=s.flags, negate=s.negate) for s in specs]


def _label_entries(specs: Iterable[LabelSpec]) -> list[LabelMatcherEntry]:
    return [LabelMatcherEntry(kind=s.kind, pattern=s.pattern, flags=s.flags) for s in specs]


def _runs_on_entry(runs_on: RunsOn) -> RunsOnEntry:
    return RunsOnEntry(labels=_label_entries(runs_on.labels), exclude=_label_entries(runs_on.exclude))


def _condition_entries(
    conditions: Mapping[str, sdk_triggers.Condition],
) -> dict[str, EqualsCondition | InCondition | RegexCondition]:
    result: dict[str, EqualsCondition | InCondition | RegexCondition] = {}
    for path, condition in conditions.items():
        if condition.kind == "equals":
            result[path] = EqualsCondition(equals=condition.value)
        elif condition.kind == "in":
            result[path] = InCondition(**{"in": list(condition.value)})
        else:
            result[path] = RegexCondition(regex=condition.value, flags=condition.flags)
    return result


def _from_repos(specs: tuple[PatternSpec, ...] | None) -> list[PatternEntry] | None:
    return None if specs is None else _pattern_entries(specs)


def trigger_entries(trigger: sdk_triggers.Trigger) -> list[TriggerEntry]:
    """The lock entries of one SDK trigger (`push(branches, tags)` gives a push and a tag entry)."""
    if isinstance(trigger, sdk_triggers.PushTrigger):
        entries: list[TriggerEntry] = []
        if trigger.emits_push:
            entries.append(
                PushTriggerEntry(
                    type="push",
                    branches=_pattern_entries(trigger.branches),
                    paths=_pattern_entries(trigger.paths),
                )
            )
        if trigger.tags is not None:
            entries.append(TagTriggerEntry(type="tag", patterns=_pattern_entries(trigger.tags)))
        return entries
    if isinstance(trigger, sdk_triggers.TagTrigger):
        return [TagTriggerEntry(type="tag", patterns=_pattern_entries(trigger.patterns))]
    if isinstance(trigger, sdk_triggers.PrTrigger):
        return [
            PrTriggerEntry(
                type="pr",
                events=list(trigger.events),
                target=_pattern_entries(trigger.target),
                source=_pattern_entries(trigger.source),
                paths=_pattern_entries(trigger.paths),
            )
        ]
    if isinstance(trigger, sdk_triggers.DispatchTrigger):
        inputs = {
            name: InputEntry(
                type=sdk_triggers.input_type_name(spec),
                required=spec.required,
                default=spec.default,
                choices=None if spec.choices is None else list(spec.choices),
                min=spec.min,
                max=spec.max,
                pattern=spec.pattern,
                description=spec.description,
            )
            for name, spec in trigger.inputs.items()
        }
        return [DispatchTriggerEntry(type="dispatch", types=list(trigger.types), inputs=inputs)]
    if isinstance(trigger, sdk_triggers.ScheduleTrigger):
        return [
            ScheduleTriggerEntry(
                type="schedule", cron=trigger.cron, timezone=trigger.timezone, inputs=dict(trigger.inputs)
            )
        ]
    if isinstance(trigger, sdk_triggers.EventTrigger):
        return [
            EventTriggerEntry(
                type="event",
                name=trigger.name,
                match=_condition_entries(trigger.match),
                **{"not": _condition_entries(trigger.not_)},
                from_repos=_from_repos(trigger.from_repos),
            )
        ]
    if isinstance(trigger, sdk_triggers.WorkflowCompleteTrigger):
        return [
            WorkflowCompleteTriggerEntry(
                type="workflow_complete",
                workflow=_pattern_entries(trigger.workflow),
                status=list(trigger.status),
                from_repos=_from_repos(trigger.from_repos),
            )
        ]
    if isinstance(trigger, sdk_triggers.JobCompleteTrigger):
        return [
            JobCompleteTriggerEntry(
                type="job_complete",
                workflow=_pattern_entries(trigger.workflow),
                job=_pattern_entries(trigger.job),
                status=list(trigger.status),
                from_repos=_from_repos(trigger.from_repos),
            )
        ]
    if isinstance(trigger, sdk_triggers.WorkflowsFailedBatchTrigger):
        return [
            WorkflowsFailedBatchTriggerEntry(
                type="workflows_failed_batch",
                window_ms=trigger.window_ms,
                workflow=_pattern_entries(trigger.workflow),
                from_repos=_from_repos(trigger.from_repos),
            )
        ]
    return [
        GenericWebhookTriggerEntry(
            type="generic_webhook",
            source=trigger.source,
            events=_pattern_entries(trigger.events),
            match=_condition_entries(trigger.match),
            **{"not": _condition_entries(trigger.not_)},
        )
    ]


_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array", dict: "object"}


def outputs_schema(outputs: object) -> dict[str, Any] | None:
    """JSON Schema of a step's declared outputs (a name→type mapping or a pydantic model)."""
    if outputs is None:
        return None
    if isinstance(outputs, Mapping):
        return {
            "type": "object",
            "properties": {key: {"type": _JSON_TYPES[kind]} for key, kind in outputs.items()},
            "required": list(outputs),
            "additionalProperties": False,
        }
    schema: dict[str, Any] = outputs.model_json_schema()  # type: ignore[attr-defined]
    return schema


class _EntryBuilder:
    """Builds lock entries for one workflow file, turning SDK objects into models with relative sources."""

    def __init__(self, names: _PathNames) -> None:
        self.names = names

    def function_source(self, fn: Any) -> SourceRef:
        code = fn.__code__
        return self.names.source(code.co_filename, code.co_firstlineno, fn.__qualname__, fn.__module__)

    def rule_entries(self, rules: list[Rule]) -> list[RuleEntry]:
        return [
            RuleEntry(
                index=index,
                label=item.label,
                kind=item.kind,
                has_check=item.check is not None,
                source=self.function_source(item.check)
                if item.check is not None and hasattr(item.check, "__code__")
                else self.names.source(item.location[0], item.location[1], None),
            )
            for index, item in enumerate(rules)
        ]

    def hook_entries(self, hooks: Mapping[str, Hook]) -> dict[Any, HookEntry]:
        return {
            kind: HookEntry(source=self.function_source(hooks[kind].fn), timeout_ms=hooks[kind].timeout_ms)
            for kind in HOOK_KINDS
            if kind in hooks
        }

    def step_entry(self, item: Step) -> StepEntry:
        retry = item.retry
        return StepEntry(
            name=item.name,
            source=self.function_source(item.fn)
            if hasattr(item.fn, "__code__")
            else self.names.source(*item.location, None),
            timeout_ms=item.timeout_ms,
            continue_on_error=item.continue_on_error,
            outputs_schema=outputs_schema(item.outputs),
            rules=self.rule_entries(item.rules),
            retry=None
            if retry is None
            else RetryEntry(
                max_attempts=retry.max_attempts,
                delay_ms=retry.delay_ms,
                backoff=retry.backoff,
                max_delay_ms=retry.max_delay_ms,
                has_retry_on=retry.retry_on is not None,
            ),
        )

    def job_entry(self, item: Job, needs: list[NeedEntry]) -> JobEntry:
        qualname = item.fn.__qualname__ if item.fn is not None else None
        return JobEntry(
            name=item.name,
            description=item.description,
            source=self.names.source(item.location[0], item.location[1], qualname),
            runs_on=_runs_on_entry(item.runs_on),
            needs=needs,
            matrix=None
            if item.matrix is None or item.matrix_keys is None
            else MatrixEntry(keys=list(item.matrix_keys), combinations=[dict(c) for c in item.matrix]),
            max_parallel=item.max_parallel,
            fail_fast=item.fail_fast,
            timeout_ms=item.timeout_ms,
            grace_period_ms=item.grace_period_ms,
            env=dict(item.env),
            environment=item.environment,
            concurrency_group=item.concurrency_group,
            checkout=item.checkout,
            rules=self.rule_entries(item.rules),
            hooks=self.hook_entries(item.hooks),
            steps=[self.step_entry(s) for s in item.steps],
            fanout=item.fanout,
            container=None
            if item.container is None
            else ContainerEntry(
                image=item.container.image, env=dict(item.container.env), options=dict(item.container.options)
            ),
            services={
                name: ServiceEntry(
                    image=service.image,
                    env=dict(service.env),
                    ports=list(service.ports),
                    command=None if service.command is None else list(service.command),
                    health_cmd=service.health_cmd,
                    health_interval_ms=service.health_interval_ms,
                    health_timeout_ms=service.health_timeout_ms,
                )
                for name, service in item.services.items()
            },
        )


def _needs_cycle(graph: Mapping[str, list[str]]) -> list[str] | None:
    """A cycle in the needs graph as a path (`a, b, a`), or None; visits jobs in declaration order."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for upstream in graph.get(node, []):
            if state.get(upstream) == 1:
                return [*stack[stack.index(upstream) :], upstream]
            if upstream not in state and (cycle := visit(upstream)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in graph:
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def build_workflow_entry(
    item: Workflow, *, attribute: str, names: _PathNames, hashed: list[tuple[str, bytes]]
) -> tuple[WorkflowEntry, list[Diagnostic]]:
    """Validate what only the whole workflow can tell (needs, cycles, steps, hooks) and build its entry."""
    builder = _EntryBuilder(names)
    errors: list[Diagnostic] = []

    def error(code: str, message: str, location: tuple[str, int]) -> None:
        file = names.relative(location[0]) or location[0]
        errors.append(Diagnostic("error", code, file, location[1], message))

    jobs: list[JobEntry] = []
    graph: dict[str, list[str]] = {}
    for job_item in item.jobs.values():
        if not job_item.steps:
            error("E108", f"job {job_item.name!r} has no steps (add @job.step or run=fn)", job_item.location)
        needs: list[NeedEntry] = []
        for need in job_item.needs:
            upstream = need.job_name
            if isinstance(need.job, Job) and need.job.workflow is not item:
                error(
                    "E106", f"job {job_item.name!r} needs {upstream!r} of another workflow", job_item.location
                )
            elif upstream == job_item.name:
                error("E106", f"job {job_item.name!r} needs itself", job_item.location)
            elif upstream not in item.jobs:
                error(
                    "E106",
                    f"job {job_item.name!r} needs unknown job {upstream!r}{did_you_mean(upstream, item.jobs)}",
                    job_item.location,
                )
            needs.append(NeedEntry(job=upstream, run_on=list(need.run_on)))
        graph[job_item.name] = [n.job for n in needs if n.job in item.jobs and n.job != job_item.name]
        jobs.append(builder.job_entry(job_item, needs))
    if not errors and (cycle := _needs_cycle(graph)):
        error("E107", f"needs cycle: {' → '.join(cycle)}", item.jobs[cycle[0]].location)
    if not item.jobs:
        error("E108", f"workflow {item.name!r} has no jobs", item.location)
    if item.hooks:
        if item.hooks_runs_on is None:
            error("E117", f"workflow {item.name!r} has hooks but no hooks_runs_on", item.location)
        else:
            jobs.append(
                JobEntry(
                    name=HOOKS_JOB_NAME,
                    description="workflow hooks",
                    source=names.source(item.location[0], item.location[1], None),
                    runs_on=_runs_on_entry(item.hooks_runs_on),
                    needs=[NeedEntry(job=j.name, run_on=list(WHEN_STATUSES["always"])) for j in jobs],
                    matrix=None,
                    max_parallel=None,
                    fail_fast=False,
                    timeout_ms=None,
                    grace_period_ms=10_000,
                    env={},
                    environment=None,
                    concurrency_group=None,
                    checkout=True,
                    rules=[],
                    hooks={},
                    steps=[],
                )
            )
    triggers = [entry for trigger in item.triggers for entry in trigger_entries(trigger)]
    concurrency = item.concurrency
    entry = WorkflowEntry(
        name=item.name,
        description=item.description,
        source=names.source(item.location[0], item.location[1], attribute),
        content_hash=content_hash(hashed),
        hashed_files=sorted(path for path, _ in hashed),
        triggers=triggers,
        rules=builder.rule_entries(item.rules),
        concurrency=None
        if concurrency is None
        else ConcurrencyEntry(
            group=concurrency.group, cancel_in_progress=concurrency.cancel_in_progress, max=concurrency.max
        ),
        timeout_ms=item.timeout_ms,
        hooks_runs_on=None if item.hooks_runs_on is None else _runs_on_entry(item.hooks_runs_on),
        hooks=builder.hook_entries(item.hooks),
        jobs=jobs,
        global_=None
        if item.global_repos is None
        else GlobalEntry(repos=list(item.global_repos), required=item.required),
    )
    return entry, errors


def _hash_file_matches(root: Path, patterns: Iterable[str]) -> list[str]:
    from wcmatch import glob

    flags = glob.GLOBSTAR | glob.BRACE | glob.DOTMATCH | glob.FORCEUNIX | glob.NODIR
    return sorted(set(glob.glob(list(patterns), root_dir=str(root), flags=flags))) if patterns else []


def compile_repository(root: Path) -> CompileResult:
    """Compile every workflow file under `root/.conveyor/workflows` into a lock (nothing is written)."""
    root = root.resolve()
    names = _PathNames(root)
    files = discover_workflow_files(root)
    errors: list[Diagnostic] = []
    warnings: list[Diagnostic] = []
    if not files:
        warnings.append(Diagnostic("warning", "W202", ".conveyor/workflows", 0, "no workflow files found"))
    entries: list[WorkflowEntry] = []
    seen_names: dict[str, str] = {}
    for path in files:
        relative = names.relative(str(path)) or path.name
        try:
            imported = import_workflow_file(root, path)
        except FileImportError as failure:
            errors.extend(failure.diagnostics)
            continue
        found = module_workflows(imported.module)
        hashed_paths = sorted({relative, *imported.imported_files})
        for attribute, item in found:
            paths = sorted({*hashed_paths, *_hash_file_matches(root, item.hash_files)})
            hashed = [(p, (root / p).read_bytes()) for p in paths]
            entry, problems = build_workflow_entry(item, attribute=attribute, names=names, hashed=hashed)
            errors.extend(problems)
            if item.name in seen_names:
                errors.append(
                    Diagnostic(
                        "error",
                        "E102",
                        entry.source.file,
                        entry.source.line,
                        f"workflow {item.name!r} is already defined in {seen_names[item.name]}",
                    )
                )
            seen_names.setdefault(item.name, entry.source.file)
            if not entry.triggers:
                warnings.append(
                    Diagnostic(
                        "warning",
                        "W201",
                        entry.source.file,
                        entry.source.line,
                        f"workflow {item.name!r} has no triggers (it never matches)",
                    )
                )
            entries.append(entry)
    if errors:
        return CompileResult(None, None, errors, warnings)
    entries.sort(key=lambda entry: (entry.source.file, entry.source.line))
    lock = Lock(schema_version=LOCK_SCHEMA_VERSION, workflows=entries)
    data = render_lock(lock)
    if len(data) > MAX_LOCK_BYTES:
        error = Diagnostic("error", "E118", ".conveyor/conveyor.lock.json", 0, "lock file would exceed 5 MiB")
        return CompileResult(None, None, [error], warnings)
    return CompileResult(lock, data, errors, warnings)


@dataclass(frozen=True, slots=True)
class LockDrift:
    """How a committed lock differs from the sources: workflow names added, removed or changed."""

    added: tuple[str, ...]
    removed: tuple[str, ...]
    changed: tuple[str, ...]
    missing: bool = False

    def describe(self) -> str:
        """One line naming the out-of-date workflows."""
        if self.missing:
            return "lock file is missing; run `conveyor compile`"
        parts = []
        for label, names in (("changed", self.changed), ("added", self.added), ("removed", self.removed)):
            if names:
                parts.append(f"{label}: {', '.join(names)}")
        detail = "; ".join(parts) or "formatting differs"
        return f"lock file is out of date ({detail}); run `conveyor compile` and commit the lock"


def lock_drift(committed: bytes | None, compiled: Lock) -> LockDrift:
    """Compare a committed lock's bytes with a freshly compiled lock, per workflow name."""
    if committed is None:
        return LockDrift((), (), (), missing=True)
    new = {entry.name: entry.model_dump(mode="json", by_alias=True) for entry in compiled.workflows}
    try:
        document = json.loads(committed)
        old = {entry["name"]: entry for entry in document["workflows"]}
    except (ValueError, KeyError, TypeError):
        return LockDrift((), (), tuple(new))
    return LockDrift(
        added=tuple(name for name in new if name not in old),
        removed=tuple(name for name in old if name not in new),
        changed=tuple(name for name in new if name in old and old[name] != new[name]),
    )
