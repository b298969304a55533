"""How `conveyor preview` prints a decision trace and the job plan of matched workflows."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from conveyor.lockfile.models import LabelMatcherEntry, Lock, RunsOnEntry
from conveyor.matching import Decision, Event, WorkflowPlan, event_summary, plan_workflow
from conveyor.matching.trace_text import event_line, run_trace_lines, workflow_decision_lines

_WHEN_NAMES = {
    ("success",): "on-success",
    ("success", "skipped"): "on-skip",
    ("failed", "timed_out"): "on-failure",
    ("success", "failed", "cancelled", "skipped", "timed_out"): "always",
}


def _matcher(matcher: LabelMatcherEntry) -> str:
    if matcher.kind == "regex":
        return f"re:{matcher.pattern}"
    return matcher.pattern


def describe_runs_on(runs_on: RunsOnEntry) -> str:
    """`linux + docker, not conveyor:host:canary-*`."""
    text = " + ".join(_matcher(m) for m in runs_on.labels)
    if runs_on.exclude:
        text += ", not " + ", ".join(_matcher(m) for m in runs_on.exclude)
    return text


def _plan_json(plan: WorkflowPlan) -> dict[str, Any]:
    return {
        "workflow": plan.workflow,
        "concurrency_group": plan.concurrency_group,
        "jobs": [
            {
                "job": job.job,
                "display": job.display,
                "matrix": job.matrix,
                "matrix_key": job.matrix_key,
                "needs": [{"job": name, "run_on": list(run_on)} for name, run_on in job.needs],
                "runs_on": job.runs_on.model_dump(mode="json"),
                "environment": job.environment,
                "concurrency_group": job.concurrency_group,
                "rule_count": job.rule_count,
                "container": job.container,
                "services": dict(job.services),
            }
            for job in plan.jobs
        ],
    }


def render_preview_json(decision: Decision, lock: Lock, event: Event, only: str | None) -> str:
    """The decision trace document, plus the job plans of matched workflows."""
    document = decision.as_dict()
    if only is not None:
        document["workflows"] = [w for w in document["workflows"] if w["workflow"] == only]
    plans = []
    for name in decision.matched:
        entry = lock.workflow(name)
        if entry is not None and (only is None or name == only):
            plans.append(_plan_json(plan_workflow(entry, event)))
    document["plans"] = plans
    return json.dumps(document, indent=2, ensure_ascii=False)


def render_preview(decision: Decision, lock: Lock, event: Event, only: str | None) -> str:
    """Human form: one block per workflow with every trigger's checks, then the job plan when matched."""
    lines = [event_line(event_summary(event)), ""]
    shown = [w for w in decision.workflows if only is None or w.workflow == only]
    if not shown:
        lines.append("no workflows in the lock file")
    for workflow in shown:
        lines.extend(workflow_decision_lines(workflow))
        if workflow.matched:
            entry = lock.workflow(workflow.workflow)
            if entry is not None:
                lines.extend(_plan_lines(plan_workflow(entry, event)))
        lines.append("")
    matched = decision.matched
    lines.append(
        f"{len(matched)} workflow(s) would run: {', '.join(matched)}" if matched else "nothing would run"
    )
    return "\n".join(lines)


def render_run_trace(trace: Mapping[str, Any]) -> str:
    """A run's stored decision trace in `preview`'s form (`conveyor.matching.trace_text`)."""
    return "\n".join(run_trace_lines(trace))


def _plan_lines(plan: WorkflowPlan) -> list[str]:
    lines = ["    plan:"]
    if plan.concurrency_group is not None:
        lines.append(f"        concurrency group: {plan.concurrency_group}")
    for job in plan.jobs:
        details = [f"runs_on {describe_runs_on(job.runs_on)}"]
        if job.needs:
            needs = ", ".join(
                f"{name} ({_WHEN_NAMES.get(run_on, '/'.join(run_on))})" for name, run_on in job.needs
            )
            details.append(f"needs {needs}")
        if job.environment:
            details.append(f"environment {job.environment}")
        if job.concurrency_group:
            details.append(f"group {job.concurrency_group}")
        if job.container:
            details.append(f"container {job.container}")
        if job.services:
            details.append("services " + ", ".join(f"{name} ({image})" for name, image in job.services))
        if job.rule_count:
            details.append(f"{job.rule_count} rule(s) evaluated on the agent")
        lines.append(f"        {job.display}: " + "; ".join(details))
    return lines
