"""The job plan of a matched workflow: expanded matrix jobs with rendered templates (no user code runs)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from conveyor.lockfile.models import JobEntry, RunsOnEntry, WorkflowEntry
from conveyor.matching.event import Event
from conveyor.matching.templates import render_template
from conveyor.sdk.matrix import matrix_display, matrix_key


@dataclass(frozen=True, slots=True)
class PlannedJob:
    """One job row the orchestrator creates: a job, or one combination of a matrix job."""

    job: str
    display: str
    matrix: dict[str, Any] | None
    matrix_key: str | None
    needs: tuple[tuple[str, tuple[str, ...]], ...]
    runs_on: RunsOnEntry
    environment: str | None
    concurrency_group: str | None
    rule_count: int
    container: str | None = None  # the job container's image (docs/design/containers.md §1)
    services: tuple[tuple[str, str], ...] = ()  # (name, image) in declaration order
    fanout: bool = False  # one execution per connected matching agent (docs/design/execution.md §13)


@dataclass(frozen=True, slots=True)
class WorkflowPlan:
    """The rendered workflow concurrency group (None: no limit) and the planned jobs."""

    workflow: str
    concurrency_group: str | None
    jobs: tuple[PlannedJob, ...]


def _render(
    template: str | None, event: Event, workflow: str, job: JobEntry, matrix: dict[str, Any] | None
) -> str | None:
    if template is None:
        return None
    return render_template(template, event=event, workflow=workflow, job=job.name, matrix=matrix)


def plan_workflow(workflow: WorkflowEntry, event: Event) -> WorkflowPlan:
    """Expand a workflow's jobs for an event; an empty rendered group means no limit (None)."""
    planned: list[PlannedJob] = []
    for job in workflow.jobs:
        combinations: list[dict[str, Any] | None] = (
            [dict(combination) for combination in job.matrix.combinations] if job.matrix else [None]
        )
        for combination in combinations:
            environment = _render(job.environment, event, workflow.name, job, combination)
            # A job's concurrency group defaults to its environment template (one deploy per environment).
            group_template = job.concurrency_group if job.concurrency_group is not None else job.environment
            group = _render(group_template, event, workflow.name, job, combination)
            rule_count = len(workflow.rules) + len(job.rules) + sum(len(step.rules) for step in job.steps)
            planned.append(
                PlannedJob(
                    job=job.name,
                    display=matrix_display(job.name, combination) if combination else job.name,
                    matrix=combination,
                    matrix_key=matrix_key(combination) if combination else None,
                    needs=tuple((need.job, tuple(need.run_on)) for need in job.needs),
                    runs_on=job.runs_on,
                    environment=environment or None,
                    concurrency_group=group or None,
                    rule_count=rule_count,
                    container=None if job.container is None else job.container.image,
                    fanout=job.fanout,
                    services=tuple((name, service.image) for name, service in job.services.items()),
                )
            )
    group = None
    if workflow.concurrency is not None:
        group = render_template(workflow.concurrency.group, event=event, workflow=workflow.name) or None
    return WorkflowPlan(workflow.name, group, tuple(planned))
