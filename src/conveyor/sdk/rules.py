"""Rules: checks evaluated on the agent before a workflow's jobs, a job or a step
(docs/design/authoring.md §2.3)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from conveyor.sdk.errors import authoring_error, caller_location

RuleCheck = Callable[[Any], Any]


@dataclass(frozen=True, slots=True)
class Rule:
    """`rule` passes when its check is truthy (or it has none); `skip` passes when its check is falsy."""

    label: str
    kind: Literal["rule", "skip"]
    check: RuleCheck | None
    location: tuple[str, int]


def _check_label(label: object) -> str:
    if not isinstance(label, str) or not label.strip():
        raise authoring_error("E105", f"a rule needs a non-empty label, got {label!r}")
    return label


def rule(label: str, check: RuleCheck | None = None) -> Rule:
    """A rule that passes when `check(ctx)` is truthy; with no check it is an always-passing marker."""
    if check is not None and not callable(check):
        raise authoring_error("E114", f"rule {label!r}: check must be callable")
    return Rule(_check_label(label), "rule", check, caller_location())


def skip(label: str, check: RuleCheck) -> Rule:
    """A rule that skips (passes only) when `check(ctx)` is falsy."""
    if not callable(check):
        raise authoring_error("E114", f"skip {label!r}: check must be callable")
    return Rule(_check_label(label), "skip", check, caller_location())


def as_rules(rules: object) -> list[Rule]:
    """Validate a `rules=` option."""
    items = list(rules)  # type: ignore[call-overload]
    for item in items:
        if not isinstance(item, Rule):
            raise authoring_error("E114", f"rules=: {item!r} is not a rule(...) or skip(...)")
    return items


class RuleDecorators:
    """`@owner.rule("label")` and `@owner.skip("label")` for workflows, jobs and steps."""

    rules: list[Rule]

    def rule(self, label: str) -> Callable[[RuleCheck], RuleCheck]:
        """Decorate a check function as a rule of this owner."""
        _check_label(label)

        def add(check: RuleCheck) -> RuleCheck:
            self.rules.append(Rule(label, "rule", check, caller_location()))
            return check

        return add

    def skip(self, label: str) -> Callable[[RuleCheck], RuleCheck]:
        """Decorate a check function whose truthy result skips this owner."""
        _check_label(label)

        def add(check: RuleCheck) -> RuleCheck:
            self.rules.append(Rule(label, "skip", check, caller_location()))
            return check

        return add
