"""The decision trace: per workflow, per trigger, per filter, matched or not and why
(docs/design/authoring.md §5)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Check:
    """One filter of one trigger: `filter` names a filter of docs/design/authoring.md §5, `detail` is for
    humans."""

    filter: str
    ok: bool
    detail: str

    def as_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {"filter": self.filter, "ok": self.ok, "detail": self.detail}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Check:
        """Back from `as_dict` (a stored trace)."""
        return cls(
            filter=str(data.get("filter", "")), ok=bool(data.get("ok")), detail=str(data.get("detail", ""))
        )


@dataclass(frozen=True, slots=True)
class TriggerDecision:
    """One trigger's verdict; `buffered` when a failed run was added to a `workflows_failed_batch` window."""

    index: int
    type: str
    matched: bool
    checks: tuple[Check, ...]
    buffered: bool = False

    def as_dict(self) -> dict[str, Any]:
        """JSON form."""
        result: dict[str, Any] = {
            "index": self.index,
            "type": self.type,
            "matched": self.matched,
            "checks": [check.as_dict() for check in self.checks],
        }
        if self.buffered:
            result["buffered"] = True
        return result

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TriggerDecision:
        """Back from `as_dict` (a stored trace)."""
        return cls(
            index=int(data.get("index", 0)),
            type=str(data.get("type", "")),
            matched=bool(data.get("matched")),
            checks=tuple(Check.from_dict(check) for check in data.get("checks") or ()),
            buffered=bool(data.get("buffered", False)),
        )


@dataclass(frozen=True, slots=True)
class WorkflowDecision:
    """One workflow's verdict: matched when any trigger matched (`matched_trigger` is the lowest index)."""

    workflow: str
    matched: bool
    matched_trigger: int | None
    triggers: tuple[TriggerDecision, ...]

    @property
    def buffered(self) -> bool:
        """True when a `workflows_failed_batch` trigger buffered the event instead of matching."""
        return any(trigger.buffered for trigger in self.triggers)

    def as_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "workflow": self.workflow,
            "matched": self.matched,
            "matched_trigger": self.matched_trigger,
            "triggers": [trigger.as_dict() for trigger in self.triggers],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> WorkflowDecision:
        """Back from `as_dict` (a stored trace)."""
        matched_trigger = data.get("matched_trigger")
        return cls(
            workflow=str(data.get("workflow", "")),
            matched=bool(data.get("matched")),
            matched_trigger=None if matched_trigger is None else int(matched_trigger),
            triggers=tuple(TriggerDecision.from_dict(trigger) for trigger in data.get("triggers") or ()),
        )


@dataclass(frozen=True, slots=True)
class Decision:
    """The whole decision for one event against one lock; stored with every run it creates."""

    event: dict[str, Any]
    lock_status: str
    schema_version: int | None
    workflows: tuple[WorkflowDecision, ...]

    @property
    def matched(self) -> list[str]:
        """Names of the matched workflows, in lock order."""
        return [decision.workflow for decision in self.workflows if decision.matched]

    def for_workflow(self, name: str) -> WorkflowDecision | None:
        """The decision about one workflow."""
        return next((decision for decision in self.workflows if decision.workflow == name), None)

    def as_dict(self) -> dict[str, Any]:
        """The trace JSON document."""
        return {
            "event": self.event,
            "lock": {"status": self.lock_status, "schema_version": self.schema_version},
            "workflows": [decision.as_dict() for decision in self.workflows],
        }

    def to_json(self, *, indent: int | None = None) -> str:
        """The trace as JSON text."""
        return json.dumps(self.as_dict(), indent=indent, ensure_ascii=False)
