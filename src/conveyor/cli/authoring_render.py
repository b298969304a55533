"""How `conveyor preview` prints a decision trace and the job plan of matched workflows."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from conveyor.lockfile.models import LabelMatcherEntry, Lock, RunsOnEntry
from conveyor.matching import Decision, Event, WorkflowDecision, WorkflowPlan, event_summary, plan_workflow

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


def event_line(event: Mapping[str, Any]) -> str:
    """One line for an event summary (`conveyor.matching.event_summary`, as runs store it)."""
    kind, action = event.get("type") or "?", event.get("action")
    where = event.get("branch") or event.get("tag") or action or ""
    parts = [f"event {kind}" + (f" ({action})" if action and kind == "pr" else "")]
    if where:
        parts.append(f"on {where}")
    if event.get("base_branch"):
        parts.append(f"into {event['base_branch']}")
    if event.get("sha"):
        parts.append(f"at {str(event['sha'])[:12]}")
    changed = event.get("changed_files")
    parts.append(f"changed files: {'unknown' if changed is None else len(changed)}")
    return " ".join(parts)


def workflow_decision_lines(workflow: WorkflowDecision) -> list[str]:
    """One workflow's verdict with every trigger's checks (what `preview` and `run show` print)."""
    lines = []
    if workflow.matched:
        lines.append(f"MATCHED  {workflow.workflow}  (trigger {workflow.matched_trigger})")
    else:
        suffix = "  (buffered into a failure batch)" if workflow.buffered else ""
        lines.append(f"no match {workflow.workflow}{suffix}")
    if not workflow.triggers:
        lines.append("    no triggers: this workflow never matches")
    for trigger in workflow.triggers:
        verdict = "matched" if trigger.matched else "not matched"
        lines.append(f"    trigger {trigger.index} {trigger.type}: {verdict}")
        if not trigger.checks:
            lines.append("        (no filters)")
        for check in trigger.checks:
            lines.append(f"        {'ok ' if check.ok else 'NO '} {check.filter}: {check.detail}")
    return lines


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
    """A run's stored decision trace in `preview`'s form: the event, then the workflow's verdict (a run
    made by a lock file that could not be read stores the whole decision: its lock status and every
    workflow)."""
    lines = [event_line(trace.get("event") or {})]
    lock = trace.get("lock") or {}
    if lock.get("status") not in (None, "ok"):
        lines.append(f"lock file: {lock['status']}" + (f" ({lock['detail']})" if lock.get("detail") else ""))
    workflows = [trace["workflow"]] if trace.get("workflow") else list(trace.get("workflows") or ())
    for workflow in workflows:
        lines.extend(workflow_decision_lines(WorkflowDecision.from_dict(workflow)))
    return "\n".join(lines)


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
