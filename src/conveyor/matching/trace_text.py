"""A decision trace as readable lines: what `conveyor preview`, `admin run show` and the run page print.

Pure text from the trace's JSON form (`Decision.as_dict`, or the one workflow a run stores), so the CLI
(layer 11) and the dashboard (layer 9) render the same decision with the same words.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from conveyor.matching.trace import WorkflowDecision


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


def run_trace_lines(trace: Mapping[str, Any]) -> list[str]:
    """A run's stored decision trace in `preview`'s form: the event, then the workflow's verdict (a run
    made by a lock file that could not be read stores the whole decision: its lock status and every
    workflow). A re-run matched nothing: its trace names the run it repeats."""
    rerun = trace.get("rerun")
    if isinstance(rerun, Mapping):
        what = "failed jobs of run" if rerun.get("failed_only") else "run"
        by = f" by {rerun['by']}" if rerun.get("by") else ""
        return [
            f"re-run of the {what} {rerun.get('parent_run_id') or '?'}{by}: same commit and lock, no matching"
        ]
    lines = [event_line(trace.get("event") or {})]
    lock = trace.get("lock") or {}
    if lock.get("status") not in (None, "ok"):
        lines.append(f"lock file: {lock['status']}" + (f" ({lock['detail']})" if lock.get("detail") else ""))
    origin = trace.get("global")
    if isinstance(origin, Mapping):
        required = " (required)" if origin.get("required") else ""
        commit = str(origin.get("commit_sha") or "?")[:12]
        lines.append(f"global workflow from {origin.get('source')} @ {commit}{required}")
    workflows = [trace["workflow"]] if trace.get("workflow") else list(trace.get("workflows") or ())
    for workflow in workflows:
        lines.extend(workflow_decision_lines(WorkflowDecision.from_dict(workflow)))
    lines.extend(global_trace_lines(trace))
    return lines


def global_trace_lines(trace: Mapping[str, Any]) -> list[str]:
    """A delivery's global candidates beside its own workflows, and the skipped ones with their reasons
    (docs/design/global_workflows.md §4)."""
    lines: list[str] = []
    candidates = trace.get("global")
    for candidate in candidates if isinstance(candidates, list) else ():
        lines.append(f"global from {candidate.get('source')}:")
        check = candidate.get("global_repos") or {}
        if not check.get("ok"):
            lines.append(f"no match {candidate.get('workflow')}")
        else:
            lines.extend(workflow_decision_lines(WorkflowDecision.from_dict(candidate)))
        lines.append(f"    {'ok ' if check.get('ok') else 'NO '} global_repos: {check.get('detail', '')}")
    for skipped in trace.get("skipped_global") or ():
        lines.append(
            f"skipped global {skipped.get('workflow')} from {skipped.get('source')}: {skipped.get('reason')}"
        )
    return lines
