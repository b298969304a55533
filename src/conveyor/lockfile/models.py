"""Pydantic models of `.conveyor/conveyor.lock.json` (docs/design/authoring.md §3); field order is the file's
key order."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer

LOCK_SCHEMA_VERSION = 2
LOCK_SCHEMA_MIN_READ = 1


class LockModel(BaseModel):
    """Base of every lock model: unknown fields are an error, values are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class SourceRef(LockModel):
    """Where a declaration lives: repo-relative POSIX file, qualname (or null) and line."""

    file: str
    qualname: str | None
    line: int


class PatternEntry(LockModel):
    """A filter-list entry: glob or full-match regex, possibly negated."""

    kind: Literal["glob", "regex"]
    pattern: str
    flags: Literal["", "i"]
    negate: bool


class LabelMatcherEntry(LockModel):
    """A `runs_on` label matcher."""

    kind: Literal["exact", "glob", "regex"]
    pattern: str
    flags: Literal["", "i"]


class RunsOnEntry(LockModel):
    """AND over `labels`; an agent with any label matching `exclude` is rejected."""

    labels: list[LabelMatcherEntry]
    exclude: list[LabelMatcherEntry]


class EqualsCondition(LockModel):
    """Payload value equals (JSON equality)."""

    equals: Any


class InCondition(LockModel):
    """Payload value is any of the listed values."""

    in_: list[Any] = Field(alias="in")


class RegexCondition(LockModel):
    """Payload value is a string fully matching the regex."""

    regex: str
    flags: Literal["", "i"]


Condition = EqualsCondition | InCondition | RegexCondition


class PushTriggerEntry(LockModel):
    """`push`: branch pushes."""

    type: Literal["push"]
    branches: list[PatternEntry]
    paths: list[PatternEntry]


class TagTriggerEntry(LockModel):
    """`tag`: tag pushes."""

    type: Literal["tag"]
    patterns: list[PatternEntry]


class PrTriggerEntry(LockModel):
    """`pr`: pull-request activity."""

    type: Literal["pr"]
    events: list[str]
    target: list[PatternEntry]
    source: list[PatternEntry]
    paths: list[PatternEntry]


class InputEntry(LockModel):
    """A typed dispatch input."""

    type: Literal["string", "integer", "number", "boolean", "choice"]
    required: bool
    default: Any
    choices: list[Any] | None
    min: float | None
    max: float | None
    pattern: str | None
    description: str | None


class DispatchTriggerEntry(LockModel):
    """`dispatch`: manual/API runs."""

    type: Literal["dispatch"]
    types: list[str]
    inputs: dict[str, InputEntry]


class ScheduleTriggerEntry(LockModel):
    """`schedule`: cron fires of this workflow."""

    type: Literal["schedule"]
    cron: str
    timezone: str
    inputs: dict[str, Any]


class EventTriggerEntry(LockModel):
    """`event`: custom events."""

    type: Literal["event"]
    name: str
    match: dict[str, Condition]
    not_: dict[str, Condition] = Field(alias="not")
    from_repos: list[PatternEntry] | None


class WorkflowCompleteTriggerEntry(LockModel):
    """`workflow_complete`: another run ended."""

    type: Literal["workflow_complete"]
    workflow: list[PatternEntry]
    status: list[str]
    from_repos: list[PatternEntry] | None


class JobCompleteTriggerEntry(LockModel):
    """`job_complete`: another job ended."""

    type: Literal["job_complete"]
    workflow: list[PatternEntry]
    job: list[PatternEntry]
    status: list[str]
    from_repos: list[PatternEntry] | None


class WorkflowsFailedBatchTriggerEntry(LockModel):
    """`workflows_failed_batch`: a batch of failed runs."""

    type: Literal["workflows_failed_batch"]
    window_ms: int
    workflow: list[PatternEntry]
    from_repos: list[PatternEntry] | None


class GenericWebhookTriggerEntry(LockModel):
    """`generic_webhook`: a non-git webhook source."""

    type: Literal["generic_webhook"]
    source: str
    events: list[PatternEntry]
    match: dict[str, Condition]
    not_: dict[str, Condition] = Field(alias="not")


TriggerEntry = Annotated[
    PushTriggerEntry
    | TagTriggerEntry
    | PrTriggerEntry
    | DispatchTriggerEntry
    | ScheduleTriggerEntry
    | EventTriggerEntry
    | WorkflowCompleteTriggerEntry
    | JobCompleteTriggerEntry
    | WorkflowsFailedBatchTriggerEntry
    | GenericWebhookTriggerEntry,
    Field(discriminator="type"),
]


class RuleEntry(LockModel):
    """A rule, found by owner and `index`; evaluated on the agent."""

    index: int
    label: str
    kind: Literal["rule", "skip"]
    has_check: bool
    source: SourceRef


class ConcurrencyEntry(LockModel):
    """Workflow concurrency group (template) and policy."""

    group: str
    cancel_in_progress: bool
    max: int


class HookEntry(LockModel):
    """A lifecycle hook function."""

    source: SourceRef
    timeout_ms: int


class NeedEntry(LockModel):
    """A needs edge and the upstream statuses it runs on."""

    job: str
    run_on: list[Literal["success", "failed", "cancelled", "skipped", "timed_out"]]


class MatrixEntry(LockModel):
    """The expanded matrix: the orchestrator never re-expands."""

    keys: list[str]
    combinations: list[dict[str, str | int | float | bool]]


class RetryEntry(LockModel):
    """A step's retry policy."""

    max_attempts: int
    delay_ms: int
    backoff: Literal["exponential", "fixed"]
    max_delay_ms: int
    has_retry_on: bool


class StepEntry(LockModel):
    """A step: its function and execution limits."""

    name: str
    source: SourceRef
    timeout_ms: int | None
    continue_on_error: bool
    outputs_schema: dict[str, Any] | None
    rules: list[RuleEntry]
    retry: RetryEntry | None


class ContainerEntry(LockModel):
    """The image a job's commands run in (docs/design/containers.md §2); options are checked by the SDK."""

    image: str
    env: dict[str, str]
    options: dict[str, str | int | float | bool]


class ServiceEntry(LockModel):
    """A container started beside the job, reachable by its name (docs/design/containers.md §2)."""

    image: str
    env: dict[str, str]
    ports: list[str]
    command: list[str] | None
    health_cmd: str | None
    health_interval_ms: int
    health_timeout_ms: int


class JobEntry(LockModel):
    """A job: routing, needs, matrix, limits, steps."""

    name: str
    description: str | None
    source: SourceRef
    runs_on: RunsOnEntry
    needs: list[NeedEntry]
    matrix: MatrixEntry | None
    max_parallel: int | None
    fail_fast: bool
    timeout_ms: int | None
    grace_period_ms: int
    env: dict[str, str]
    environment: str | None
    concurrency_group: str | None
    checkout: bool
    rules: list[RuleEntry]
    hooks: dict[Literal["on_success", "on_failure", "on_cancel", "cleanup"], HookEntry]
    steps: list[StepEntry]
    # Schema v2. Defaults keep job entries stored before it (dispatch payloads, job rows) readable.
    container: ContainerEntry | None = None
    services: dict[str, ServiceEntry] = Field(default_factory=dict)
    # docs/design/execution.md §13: written only when true, so locks without a fan-out job are unchanged and an
    # orchestrator that predates it refuses (unknown field) a lock it would run on one agent.
    fanout: bool = False

    @model_serializer(mode="wrap")
    def _without_default_fanout(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if not self.fanout:
            data.pop("fanout", None)
        return data


class GlobalEntry(LockModel):
    """A global workflow's reach (docs/design/global_workflows.md §2): globs on routing keys, and whether
    its status gates the triggering commit."""

    repos: list[str]
    required: bool


class WorkflowEntry(LockModel):
    """One workflow as the orchestrator sees it."""

    name: str
    description: str | None
    source: SourceRef
    content_hash: str
    hashed_files: list[str]
    triggers: list[TriggerEntry]
    rules: list[RuleEntry]
    concurrency: ConcurrencyEntry | None
    timeout_ms: int | None
    hooks_runs_on: RunsOnEntry | None
    hooks: dict[Literal["on_success", "on_failure", "on_cancel", "cleanup"], HookEntry]
    jobs: list[JobEntry]
    # Only a global workflow has the key: a lock without one is what it was before
    # (docs/design/global_workflows.md §2).
    global_: GlobalEntry | None = Field(default=None, alias="global")

    @model_serializer(mode="wrap")
    def _without_absent_global(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        if self.global_ is None and isinstance(data, dict):
            data.pop("global", None)
            data.pop("global_", None)
        return data

    def dispatch_trigger(self) -> DispatchTriggerEntry | None:
        """The workflow's first `dispatch` trigger (the one a manual run goes through), if any."""
        return next((t for t in self.triggers if isinstance(t, DispatchTriggerEntry)), None)


class Lock(LockModel):
    """The whole lock file."""

    schema_version: int
    workflows: list[WorkflowEntry]

    def workflow(self, name: str) -> WorkflowEntry | None:
        """The workflow called `name`, if any."""
        return next((entry for entry in self.workflows if entry.name == name), None)
