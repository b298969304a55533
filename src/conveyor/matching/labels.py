"""Agent label matching for `runs_on` (docs/design/authoring.md §2.4), used by the dispatcher, the scaler and
`run local`."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from conveyor.lockfile.models import LabelMatcherEntry, RunsOnEntry
from conveyor.matching.patterns import compiled_label


@dataclass(frozen=True, slots=True)
class LabelVerdict:
    """Whether a label set satisfies `runs_on`, and if not, every reason why."""

    ok: bool
    reasons: tuple[str, ...]


def _describe(matcher: LabelMatcherEntry) -> str:
    return f"{matcher.kind} '{matcher.pattern}'" + (" (ignore case)" if matcher.flags == "i" else "")


def _lowercase(labels: Iterable[str]) -> tuple[str, ...]:
    return tuple(label.lower() for label in labels)


def labels_satisfy(runs_on: RunsOnEntry, labels: Iterable[str]) -> bool:
    """True when every `labels` matcher matches some label and no label matches an `exclude` matcher."""
    agent_labels = _lowercase(labels)
    for matcher in runs_on.exclude:
        match = compiled_label(matcher.kind, matcher.pattern, matcher.flags)
        if any(match(label) for label in agent_labels):
            return False
    for matcher in runs_on.labels:
        match = compiled_label(matcher.kind, matcher.pattern, matcher.flags)
        if not any(match(label) for label in agent_labels):
            return False
    return True


def explain_labels(runs_on: RunsOnEntry, labels: Iterable[str]) -> LabelVerdict:
    """Like `labels_satisfy`, listing each unmet matcher and each excluded label."""
    agent_labels = _lowercase(labels)
    reasons: list[str] = []
    for matcher in runs_on.exclude:
        match = compiled_label(matcher.kind, matcher.pattern, matcher.flags)
        reasons.extend(
            f"label '{label}' is excluded by {_describe(matcher)}" for label in agent_labels if match(label)
        )
    for matcher in runs_on.labels:
        match = compiled_label(matcher.kind, matcher.pattern, matcher.flags)
        if not any(match(label) for label in agent_labels):
            reasons.append(f"no label matches {_describe(matcher)}")
    return LabelVerdict(ok=not reasons, reasons=tuple(reasons))


def runs_on_from_json(document: object) -> RunsOnEntry:
    """Validate a stored `runs_on` JSON object (as kept in job rows) into the lock model."""
    if isinstance(document, dict) and "agent_id" in document:
        # A fan-out host execution's queue row is pinned to its agent (docs/design/execution.md §13).
        document = {key: value for key, value in document.items() if key != "agent_id"}
    return RunsOnEntry.model_validate(document)
