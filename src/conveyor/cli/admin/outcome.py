"""What a `trigger-local` delivery became, in words (pure: the API's delivery body in, lines out)."""

from __future__ import annotations

from typing import Any

PENDING_STATUSES = frozenset({"received", "processing"})


def delivery_pending(body: dict[str, Any]) -> bool:
    """True while the server has not processed the delivery yet."""
    return str(body.get("status")) in PENDING_STATUSES


def _failed_checks(trigger: dict[str, Any]) -> list[str]:
    return [str(c.get("detail") or c.get("filter")) for c in trigger.get("checks", []) if not c.get("ok")]


def _workflow_reason(event_type: str | None, workflow: dict[str, Any]) -> str:
    """Why one workflow did not match: the failed checks of its triggers of the event's type."""
    same_type = [t for t in workflow.get("triggers", []) if t.get("type") == event_type]
    if not same_type:
        return f"it has no {event_type} trigger"
    reasons: list[str] = []
    for trigger in same_type:
        for reason in _failed_checks(trigger):
            if reason not in reasons:
                reasons.append(reason)
    return "; ".join(reasons) or str(workflow.get("reason") or "no trigger matched")


def no_run_reasons(body: dict[str, Any]) -> list[str]:
    """One line per reason a processed delivery started no run (the delivery's decision trace)."""
    if body.get("status") == "failed":
        return [f"the delivery failed: {body.get('error') or 'no detail'}"]
    if body.get("skipped"):
        return [f"skipped: {body['skipped']}"]
    if body.get("status") in ("ignored", "lock_missing", "lock_invalid"):
        detail = body.get("error") or ((body.get("decisions") or {}).get("lock") or {}).get("detail")
        return [f"the delivery is {body['status']}{': ' + str(detail) if detail else ''}"]
    decisions = body.get("decisions") or {}
    lock = decisions.get("lock") or {}
    if lock and lock.get("status") not in (None, "ok"):
        detail = lock.get("detail") or lock.get("message") or lock.get("code") or ""
        return [f"lock file {lock.get('status')}{': ' + str(detail) if detail else ''}"]
    workflows = decisions.get("workflows") or []
    if not workflows:
        return ["no workflow in the lock file at this commit"]
    event_type = (decisions.get("event") or {}).get("type")
    return [f"workflow {w.get('workflow')}: {_workflow_reason(event_type, w)}" for w in workflows]


def delivery_report(body: dict[str, Any]) -> tuple[list[str], bool]:
    """The lines `trigger-local` prints for a processed delivery, and whether it started a run."""
    runs = [str(r) for r in body.get("runs") or []]
    if runs:
        return [f"started run {run}" for run in runs], True
    return ["no run started:", *(f"  {reason}" for reason in no_run_reasons(body))], False
