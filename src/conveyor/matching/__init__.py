"""Pure matching: normalised events × lock triggers, label matchers, templates and decision traces.

Nothing here does I/O or runs user code; the orchestrator, the event router, the dispatcher, the scaler and
`conveyor preview` all call these functions.
"""

from conveyor.matching.event import (
    EVENT_TYPES,
    Event,
    completion_event,
    custom_event,
    dispatch_event,
    event_summary,
    failed_batch_event,
    generic_webhook_event,
    normalize_changed_files,
    pr_event,
    previous_tip,
    ref_event,
    schedule_event,
)
from conveyor.matching.index import LockIndex, index_lock, lock_digest, match_workflows
from conveyor.matching.inputs import InvalidInputs, validate_dispatch_inputs
from conveyor.matching.labels import LabelVerdict, explain_labels, labels_satisfy, runs_on_from_json
from conveyor.matching.matcher import (
    lock_error_decision,
    match_trigger,
    match_workflow,
    match_workflows_reference,
)
from conveyor.matching.plan import PlannedJob, WorkflowPlan, plan_workflow
from conveyor.matching.templates import render_template
from conveyor.matching.trace import Check, Decision, TriggerDecision, WorkflowDecision

__all__ = [
    "EVENT_TYPES",
    "Check",
    "Decision",
    "Event",
    "InvalidInputs",
    "LabelVerdict",
    "LockIndex",
    "PlannedJob",
    "TriggerDecision",
    "WorkflowDecision",
    "WorkflowPlan",
    "completion_event",
    "custom_event",
    "dispatch_event",
    "event_summary",
    "explain_labels",
    "failed_batch_event",
    "generic_webhook_event",
    "index_lock",
    "labels_satisfy",
    "lock_digest",
    "lock_error_decision",
    "match_trigger",
    "match_workflow",
    "match_workflows",
    "match_workflows_reference",
    "normalize_changed_files",
    "plan_workflow",
    "pr_event",
    "previous_tip",
    "ref_event",
    "render_template",
    "runs_on_from_json",
    "schedule_event",
    "validate_dispatch_inputs",
]
