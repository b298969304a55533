"""The job spec the runner reads: the `job.dispatch` payload of docs/design/execution.md §6 as a pydantic
model."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from conveyor.agent.logs import DEFAULT_LOG_MAX_BYTES
from conveyor.lockfile.models import JobEntry, WorkflowEntry

HOOKS_JOB_NAME = "__hooks__"


class SpecModel(BaseModel):
    """Base of the spec models: protocol messages may grow fields, so unknown ones are ignored."""

    model_config = ConfigDict(extra="ignore", frozen=True)


class RepoSpec(SpecModel):
    """Where to fetch the source; `auth_header` is an `Authorization` value (or a whole `Name: value` header)."""

    clone_url: str
    ref: str | None = None
    sha: str
    auth_header: str | None = None


class WorkflowRef(SpecModel):
    """The workflow the job belongs to, with what the drift check needs."""

    name: str
    file: str
    content_hash: str
    hashed_files: list[str]
    # A global workflow's own repository, checked out beside the workspace; the workflow file, its
    # requirements and the drift check's files come from there (docs/design/global_workflows.md §5).
    repo: RepoSpec | None = None

    @classmethod
    def of(cls, workflow: WorkflowEntry) -> WorkflowRef:
        """The reference to a workflow of a compiled lock."""
        return cls(
            name=workflow.name,
            file=workflow.source.file,
            content_hash=workflow.content_hash,
            hashed_files=workflow.hashed_files,
        )


class UpstreamResult(SpecModel):
    """An upstream job's aggregate status and outputs (`{step: {key: value}}`)."""

    status: str
    outputs: dict[str, dict[str, Any]] = Field(default_factory=dict)
    by_matrix: dict[str, UpstreamResult] = Field(default_factory=dict)


class RunContext(SpecModel):
    """Run-level facts: the normalised event (docs/design/authoring.md §4), the run id and the source's
    routing key."""

    event: dict[str, Any] = Field(default_factory=dict)
    run_id: str = ""
    routing_key: str | None = None


class JobSpec(SpecModel):
    """Everything a runner needs to run one job; secrets travel only here, never in rows."""

    id: str | None = None
    job_id: str
    run_id: str
    attempt: int = 1
    repo: RepoSpec | None = None  # None: the source is already in `<workspace>/src` (`run local`)
    workflow: WorkflowRef
    job: JobEntry
    display_name: str | None = None
    matrix: dict[str, Any] | None = None
    environment: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    secrets: dict[str, str] = Field(default_factory=dict)
    upstream: dict[str, UpstreamResult] = Field(default_factory=dict)
    context: RunContext = Field(default_factory=RunContext)
    log_max_bytes: int = DEFAULT_LOG_MAX_BYTES
    local: bool = False

    @model_validator(mode="before")
    @classmethod
    def _lift_job_extras(cls, data: Any) -> Any:
        """`job.dispatch` may carry `display_name`, `matrix` (this combination) and `environment` inside `job`."""
        if not isinstance(data, dict) or not isinstance(data.get("job"), dict):
            return data
        job = dict(data["job"])
        data = dict(data)
        for name in ("display_name", "environment_name", "matrix_key"):
            if name in job and name not in JobEntry.model_fields:
                value = job.pop(name)
                data.setdefault("environment" if name == "environment_name" else name, value)
        combination = job.get("matrix")
        if isinstance(combination, dict) and "combinations" not in combination:
            data.setdefault("matrix", combination)
            job["matrix"] = None
        data["job"] = job
        return data

    @property
    def name(self) -> str:
        """How the job is shown: its display name, else its name."""
        return self.display_name or self.job.name
